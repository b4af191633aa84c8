"""The demo shop: a fixed graph of listings and item pages, with the duplicate links,
robots.txt and dead links a crawler meets on real sites."""

from __future__ import annotations

import re

from crawlhub.demo import site
from tests.demo.conftest import serve_demo

HREF = re.compile(r'href="([^"]+)"')


def links(html: str) -> list[str]:
    return [h.replace("&amp;", "&") for h in HREF.findall(html)]


async def test_every_page_is_the_same_on_every_instance_and_request() -> None:
    paths = ["/", "/category/books", "/category/toys?page=3", "/item/1", "/item/57",
             "/robots.txt", "/urls.txt"]
    async with serve_demo() as a, serve_demo() as b:
        for path in paths:
            first, second, other = await a.get(path), await a.get(path), await b.get(path)
            assert first[0] == 200, path
            assert first[1] == second[1], path
            # only the origin differs between two instances
            assert first[1].replace(a.url, "") == other[1].replace(b.url, ""), path


async def test_home_links_the_categories_and_the_same_item_under_several_urls() -> None:
    async with serve_demo() as demo:
        status, html, headers = await demo.get("/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    found = links(html)
    for category in site.CATEGORIES:
        assert f"/category/{category}" in found
    assert {"/item/1", "/item/1?utm_source=home&utm_medium=banner", "/item/1#reviews"} \
        <= set(found)
    assert "/category/books?page=1" in found  # the same listing as /category/books


async def test_listing_pages_link_items_with_prices_and_the_next_page() -> None:
    async with serve_demo() as demo:
        _, first, _ = await demo.get("/category/books")
        _, last, _ = await demo.get(f"/category/books?page={site.PAGES}")
        beyond = await demo.get(f"/category/books?page={site.PAGES + 1}")
        unknown = await demo.get("/category/socks")
    first_links = links(first)
    assert "/category/books?page=2" in first_links
    assert "/item/1" in first_links and "/item/3?utm_source=listing&utm_medium=grid" in first_links
    assert first.count('class="price"') == site.PAGE_SIZE
    assert f'<span class="price" data-currency="EUR">{site.price(1)}</span>' in first
    # the last page: the rest of the 24 books, a link back, none forward
    assert last.count('class="product"') == site.PER_CATEGORY - (site.PAGES - 1) * site.PAGE_SIZE
    assert f"/category/books?page={site.PAGES - 1}" in links(last)
    assert f"/category/books?page={site.PAGES + 1}" not in links(last)
    assert beyond[0] == 404 and unknown[0] == 404


async def test_item_pages_carry_title_price_and_related_links_some_of_them_dead() -> None:
    async with serve_demo() as demo:
        _, page, _ = await demo.get("/item/10")
        dead = await demo.get("/item/1010")
        missing = await demo.get("/old-sale")
        not_a_number = await demo.get("/item/abc")
    assert f'<h1 class="title">{site.title(10)}</h1>' in page
    assert f"{site.price(10)}</p>" in page
    assert {"/item/9", "/item/11", "/item/10#reviews", "/category/books",
            "/item/1010"} <= set(links(page))
    assert dead[0] == missing[0] == not_a_number[0] == 404


async def test_robots_txt_disallows_private_pages_that_the_home_page_links() -> None:
    async with serve_demo() as demo:
        _, robots, _ = await demo.get("/robots.txt")
        _, home, _ = await demo.get("/")
    assert "User-agent: *\nDisallow: /private/\n" in robots
    assert f"Sitemap: {demo.url}/urls.txt" in robots
    assert "/private/basket" in links(home)


async def test_urls_txt_lists_every_page_once_plus_duplicate_forms() -> None:
    async with serve_demo() as demo:
        _, text, _ = await demo.get("/urls.txt")
    lines = text.splitlines()
    assert lines[0] == f"{demo.url}/"
    assert f"{demo.url}/item/{site.ITEMS}" in lines
    assert f"{demo.url}/category/garden?page={site.PAGES}" in lines
    assert f"{demo.url}/item/1?utm_source=newsletter&utm_campaign=spring" in lines
    assert f"{demo.url}/item/1#reviews" in lines
    plain = [line for line in lines if "?utm" not in line and "#" not in line]
    assert len(plain) == len(set(plain)) == 1 + len(site.CATEGORIES) * site.PAGES + site.ITEMS

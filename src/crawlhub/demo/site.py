"""The demo's shop to crawl: categories, paginated listings and item pages with prices.

A fixed graph (5 categories x 24 items, 10 per listing page) with what real sites have:
links that differ only by ``utm_*`` parameters or a fragment, a robots.txt that
disallows ``/private/``, and a few dead links that answer 404.
"""

from __future__ import annotations

import email.utils
import hashlib
import time
from html import escape
from typing import Any

from aiohttp import web

CATEGORIES = ("books", "music", "garden", "tools", "toys")
PER_CATEGORY = 24
PAGE_SIZE = 10
ITEMS = len(CATEGORIES) * PER_CATEGORY
PAGES = -(-PER_CATEGORY // PAGE_SIZE)  # listing pages per category
_ADJECTIVES = ("Sturdy", "Tiny", "Classic", "Bright", "Quiet", "Handy", "Vintage", "Smart")
_NOUNS = {"books": "Novel", "music": "Album", "garden": "Planter", "tools": "Wrench",
          "toys": "Kite"}

ROBOTS = """User-agent: *
Disallow: /private/
Allow: /

Sitemap: {base}/urls.txt
"""


def category_of(item_id: int) -> str:
    return CATEGORIES[(item_id - 1) // PER_CATEGORY]


def title(item_id: int) -> str:
    return f"{_ADJECTIVES[item_id % len(_ADJECTIVES)]} {_NOUNS[category_of(item_id)]} {item_id}"


def price(item_id: int) -> str:
    return f"{1 + (item_id * 7919) % 9900 / 100:.2f}"


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", home)
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/urls.txt", urls)
    app.router.add_get("/category/{slug}", category)
    app.router.add_get("/item/{id}", item)
    app.router.add_get("/private/{tail:.*}", private)
    app.middlewares.append(conditional)


def _page(heading: str, body: str, status: int = 200) -> web.Response:
    html = (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{escape(heading)}"
            f" - crawlhub demo shop</title></head>\n<body>\n<h1 class=\"title\">"
            f"{escape(heading)}</h1>\n{body}\n</body></html>\n")
    return web.Response(text=html, content_type="text/html", status=status)


def _link(href: str, text: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f'<a{attr} href="{escape(href)}">{escape(text)}</a>'


async def home(request: web.Request) -> web.Response:
    cats = "\n".join(f"<li>{_link(f'/category/{c}', c.title(), 'category')}</li>"
                     for c in CATEGORIES)
    featured = "\n".join([
        f"<li>{_link('/item/1', title(1), 'item')}</li>",
        # the same page again, as marketing links and anchors make it appear
        f"<li>{_link('/item/1?utm_source=home&utm_medium=banner', title(1), 'item')}</li>",
        f"<li>{_link('/item/1#reviews', 'Reviews of ' + title(1), 'item')}</li>",
        f"<li>{_link('/category/books?page=1', 'Books, page 1', 'category')}</li>",
        f"<li>{_link('/private/basket', 'Your basket')}</li>",
        f"<li>{_link('/old-sale', 'Last year' + chr(39) + 's sale')}</li>",  # 404
    ])
    return _page("crawlhub demo shop",
                 f"<ul class=\"categories\">\n{cats}\n</ul>\n"
                 f"<h2>Featured</h2>\n<ul class=\"featured\">\n{featured}\n</ul>")


async def robots(request: web.Request) -> web.Response:
    return web.Response(text=ROBOTS.format(base=_base(request)), content_type="text/plain")


async def urls(request: web.Request) -> web.Response:
    """Start URLs, one a line, for ``crawlhub frontier add``: every listing and item page,
    plus the duplicate forms a real crawl meets (``utm_*``, fragments, default port)."""
    base = _base(request)
    lines = [f"{base}/"]
    for c in CATEGORIES:
        lines += [f"{base}/category/{c}?page={p}" for p in range(1, PAGES + 1)]
    lines += [f"{base}/item/{n}" for n in range(1, ITEMS + 1)]
    lines += [f"{base}/item/{n}?utm_source=newsletter&utm_campaign=spring"
              for n in range(1, 11)]
    lines += [f"{base}/item/{n}#reviews" for n in range(1, 6)]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def category(request: web.Request) -> web.Response:
    slug = request.match_info["slug"]
    raw = request.query.get("page", "1")
    number = int(raw) if raw.isdigit() and len(raw) < 6 else 0
    if slug not in CATEGORIES or not 1 <= number <= PAGES:
        return _not_found(request)
    first = CATEGORIES.index(slug) * PER_CATEGORY + (number - 1) * PAGE_SIZE + 1
    last = min(first + PAGE_SIZE, (CATEGORIES.index(slug) + 1) * PER_CATEGORY + 1)
    rows = []
    for n in range(first, last):
        href = f"/item/{n}" if n % 3 else f"/item/{n}?utm_source=listing&utm_medium=grid"
        rows.append(f"<li class=\"product\">{_link(href, title(n), 'item')} "
                    f"<span class=\"price\" data-currency=\"EUR\">{price(n)}</span></li>")
    nav = []
    if number > 1:
        nav.append(_link(f"/category/{slug}?page={number - 1}", "previous", "prev"))
    if number < PAGES:
        nav.append(_link(f"/category/{slug}?page={number + 1}", "next", "next"))
    nav.append(_link(f"/category/{slug}#top", "back to top"))
    return _page(f"{slug.title()} - page {number}",
                 "<ul class=\"products\">\n" + "\n".join(rows) + "\n</ul>\n"
                 f"<nav>{' | '.join(nav)}</nav>\n<p>{_link('/', 'home')}</p>")


async def item(request: web.Request) -> web.Response:
    raw = request.match_info["id"]
    n = int(raw) if raw.isdigit() and len(raw) < 6 else 0
    if not 1 <= n <= ITEMS:
        return _not_found(request)
    cat = category_of(n)
    related = [m for m in (n - 1, n + 1) if m >= 1 and m <= ITEMS and category_of(m) == cat]
    links = [_link(f"/item/{m}", title(m), "related") for m in related]
    links.append(_link(f"/item/{n}#reviews", "reviews"))
    links.append(_link(f"/item/{n}?utm_source=share&utm_medium=email", "share"))
    if n % 10 == 0:
        links.append(_link(f"/item/{n + 1000}", "discontinued model"))  # answers 404
    return _page(title(n),
                 f"<p class=\"price\" data-currency=\"EUR\">{price(n)}</p>\n"
                 f"<p class=\"category\">{_link(f'/category/{cat}', cat.title(), 'category')}"
                 f"</p>\n<p class=\"description\">{title(n)}: item {n} of the {cat} shelf.</p>\n"
                 f"<div id=\"reviews\"><ul>\n"
                 + "\n".join(f"<li>{link}</li>" for link in links) + "\n</ul></div>")


async def private(request: web.Request) -> web.Response:
    return _page("Private", "<p>robots.txt disallows this page; a polite crawler never "
                 "fetches it.</p>")


def _not_found(request: web.Request) -> web.Response:
    return _page("Not found", f"<p>No page at {escape(request.path_qs)}.</p>", status=404)


def _base(request: web.Request) -> str:
    return str(request.url.origin())


#: When the demo's pages last changed (they never do while it runs): its Last-Modified.
_SINCE = email.utils.formatdate(time.time(), usegmt=True)


@web.middleware
async def conditional(request: web.Request, handler: Any) -> web.StreamResponse:
    """ETag (a hash of the page) and Last-Modified on every HTML page, and 304 Not
    Modified to a request whose If-None-Match names it: ``crawlhub crawl --recrawl``
    downloads nothing of an unchanged page."""
    response = await handler(request)
    if (request.method != "GET" or response.status != 200
            or not isinstance(response, web.Response) or response.content_type != "text/html"
            or response.body is None or not isinstance(response.body, bytes)):
        return response  # type: ignore[no-any-return]
    etag = '"' + hashlib.blake2b(response.body, digest_size=8).hexdigest() + '"'
    headers = {"ETag": etag, "Last-Modified": _SINCE, "Cache-Control": "no-cache"}
    if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
        return web.Response(status=304, headers=headers)
    response.headers.update(headers)
    return response  # type: ignore[no-any-return]

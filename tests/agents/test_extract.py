"""ExtractionRules: fields by CSS / XPath / regex / JSON path, the link rules, decoding,
hostile pages and config errors naming the key."""

from __future__ import annotations

import pytest

from crawlhub.agents.downloader import Downloader
from crawlhub.agents.extract import (
    ExtractionRules,
    ParseError,
    compile_json_path,
    decode_body,
)
from crawlhub.core.errors import ConfigError
from tests.agents.servers import Site, page_html

PAGE = b"""<!DOCTYPE html><html><head><title>  Shop &amp; more
</title></head><body>
<h1 class="name">Blue kettle</h1>
<span class="price" data-cur="EUR">12.50</span>
<ul><li class="tag">kitchen</li><li class="tag">metal</li></ul>
<p>SKU: AB-123</p>
</body></html>"""

URL = "http://shop.test:8080/items/kettle?ref=1"


def rules(fields: object = None, **links: object) -> ExtractionRules:
    return ExtractionRules.from_config({"fields": fields or {}, "links": {"follow": True, **links}})


def links_of(body: str, url: str = URL, depth: int = 0, **link_rules: object) -> list[str]:
    return rules(**link_rules).extract(body.encode(), url, depth=depth).links


# --- fields -------------------------------------------------------------------------


def test_fields_by_css_xpath_and_regex_first_match_or_all() -> None:
    got = rules({
        "name": {"css": "h1.name::text"},
        "currency": {"css": ".price::attr(data-cur)"},
        "price": {"xpath": "//span[@class='price']/text()"},
        "tags": {"css": "li.tag::text", "all": True},
        "sku": {"regex": r"SKU: ([A-Z]+-\d+)"},
        "digits": {"regex": r"\b\d{2,}\b", "all": True},
        "missing": {"css": "table td::text"},
        "tag_count": {"xpath": "count(//li)"},
    }).extract(PAGE, URL)
    assert got.fields == {
        "name": "Blue kettle",
        "currency": "EUR",
        "price": "12.50",
        "tags": ["kitchen", "metal"],
        "sku": "AB-123",
        "digits": ["12", "50", "123"],
        "missing": None,
        "tag_count": 2.0,
    }
    assert got.title == "Shop & more"


def test_an_element_selected_without_text_comes_back_as_its_html() -> None:
    got = rules({"h1": {"css": "h1"}}).extract(PAGE, URL)
    assert got.fields["h1"] == '<h1 class="name">Blue kettle</h1>'


def test_fields_by_json_path_with_keys_indexes_and_wildcards() -> None:
    body = b'{"data": {"items": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}, "n": 2}'
    got = rules({
        "first": {"json": "data.items[0].name"},
        "last": {"json": "$.data.items[-1].id"},
        "ids": {"json": "data.items[*].id", "all": True},
        "dotted_index": {"json": "data.items.1.name"},
        "count": {"json": "n"},
        "absent": {"json": "data.nothing[3]"},
    }).extract(body, URL)
    assert got.fields == {"first": "a", "last": 2, "ids": [1, 2], "dotted_index": "b",
                          "count": 2, "absent": None}


def test_a_json_field_on_a_body_that_is_not_json_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="not JSON"):
        rules({"x": {"json": "a.b"}}).extract(PAGE, URL)


def test_json_paths_compile_to_steps() -> None:
    assert compile_json_path("a.b[0][*].c") == ("a", "b", 0, "*", "c")
    assert compile_json_path("$.x") == ("x",)
    for bad in ["", "$", "a.", "a..b", ".a", "a[b]", "a[0"]:
        with pytest.raises(ValueError):
            compile_json_path(bad)


def test_a_page_without_a_title_has_none() -> None:
    assert rules().extract(b"<p>no head</p>", URL).title is None


# --- links --------------------------------------------------------------------------


def test_links_resolve_against_the_final_url_in_page_order_without_fragments_or_repeats() -> None:
    body = """<a href="/a">root</a> <a href='b?x=1&amp;y=2'>rel</a> <a href=../c>up</a>
    <A HREF="http://shop.test:8080/d#part">abs</A> <a class="x" href="//shop.test:8080/e">pr</a>
    <a href="/a#again">dup</a> <a href="#top">self</a> <a name="no-href">none</a>
    <a href="  /f  ">spaces</a> <a href="?page=2">query</a>"""
    assert links_of(body) == [
        "http://shop.test:8080/a",
        "http://shop.test:8080/items/b?x=1&y=2",
        "http://shop.test:8080/c",
        "http://shop.test:8080/d",
        "http://shop.test:8080/e",
        "http://shop.test:8080/f",
        "http://shop.test:8080/items/kettle?page=2",
    ]


def test_links_skip_other_schemes_and_comments_and_honour_base_href() -> None:
    body = """<base href="http://shop.test:8080/deep/dir/">
    <a href="mailto:me@x.test">m</a><a href="javascript:void(0)">j</a><a href="tel:1">t</a>
    <a href="data:text/html,hi">d</a><!-- <a href="/commented-out">c</a> -->
    <a href="page">p</a> <a href="HTTP://shop.test:8080/upper">u</a>"""
    assert links_of(body) == [
        "http://shop.test:8080/deep/dir/page",
        "http://shop.test:8080/upper",
    ]


def test_links_stay_on_the_pages_domain_by_default() -> None:
    body = """<a href="http://other.test/x">o</a> <a href="http://shop.test:8080.evil.test/y">e</a>
    <a href="http://shop.test:9999/z">port</a> <a href="https://SHOP.test:8080/w">case</a>
    <a href="//cdn.test/img">cdn</a> <a href="/mine">m</a>"""
    assert links_of(body) == ["https://SHOP.test:8080/w", "http://shop.test:8080/mine"]
    assert len(links_of(body, same_domain=False)) == 6


def test_allow_and_deny_regexes_filter_absolute_links() -> None:
    body = """<a href="/item/1">1</a><a href="/item/2?print=1">2p</a><a href="/about">a</a>
    <a href="item/3">3</a>"""
    got = links_of(body, url="http://shop.test/", allow=[r"/item/\d+"], deny=[r"print="])
    assert got == ["http://shop.test/item/1", "http://shop.test/item/3"]


def test_no_links_are_taken_from_a_page_at_max_depth() -> None:
    body = '<a href="/next">n</a>'
    assert links_of(body, depth=1, max_depth=2) == ["http://shop.test:8080/next"]
    assert links_of(body, depth=2, max_depth=2) == []


def test_links_are_only_extracted_when_follow_is_on() -> None:
    off = ExtractionRules.from_config({"fields": {"t": {"css": "title::text"}}})
    got = off.extract(b'<title>t</title><a href="/x">x</a>', URL)
    assert got.links == [] and got.fields == {"t": "t"}


def test_a_page_with_100000_links_gives_them_all_or_the_cap() -> None:
    body = "<html><body>" + "".join(f'<a href="/p/{i}">{i}</a>' for i in range(100_000))
    everything = links_of(body, max_links=None)
    assert len(everything) == 100_000 and everything[-1] == "http://shop.test:8080/p/99999"
    capped = links_of(body)
    assert len(capped) == 10_000 and capped[0] == "http://shop.test:8080/p/0"


def test_the_synthetic_site_page_yields_its_title_and_ten_links() -> None:
    body = page_html(5, 1000).encode()
    got = rules().extract(body, "http://127.0.0.1:8000/page/5")
    assert got.title == "Page 5"
    assert got.links == [f"http://127.0.0.1:8000/page/{51 + k}" for k in range(10)]


# --- decoding -----------------------------------------------------------------------


async def test_a_page_that_is_not_utf8_is_decoded_by_its_declared_charset() -> None:
    async with Site() as site, Downloader() as d:
        declared = await d.fetch(f"{site.url}/latin1?charset=iso-8859-1")
        undeclared = await d.fetch(f"{site.url}/latin1")
    ex = rules({"body": {"css": "body::text"}})
    got = ex.extract(declared.body, declared.final_url, content_type=declared.content_type)
    assert got.title == "Café crème" and got.fields["body"] == "été"
    # no charset anywhere: not an error, the bytes are decoded by a best guess
    guessed = ex.extract(undeclared.body, undeclared.final_url,
                         content_type=undeclared.content_type)
    assert guessed.title is not None and guessed.title.startswith("Caf")


def test_decode_body_prefers_the_header_then_utf8_then_the_pages_meta() -> None:
    assert decode_body("é".encode(), "text/html; charset=utf-8") == "é"
    assert decode_body("é".encode("latin-1"), "text/html; charset=latin-1") == "é"
    assert decode_body("é".encode()) == "é"
    meta = '<meta charset="windows-1251"><p>Привет</p>'.encode("cp1251")
    assert "Привет" in decode_body(meta, "text/html")
    assert decode_body(b"\xff\xfe\x00garbage\x80", "text/html; charset=nonsense")


# --- config errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"fields": {"price": {"css": "span[["}}}, "extract.fields.price.css"),
        ({"fields": {"price": {"xpath": "//span[@"}}}, "extract.fields.price.xpath"),
        ({"fields": {"price": {"regex": "(unclosed"}}}, "extract.fields.price.regex"),
        ({"fields": {"price": {"json": "a..b"}}}, "extract.fields.price.json"),
        ({"fields": {"price": {}}}, "extract.fields.price"),
        ({"fields": {"price": {"css": "p", "xpath": "//p"}}}, "extract.fields.price"),
        ({"fields": {"price": {"css": "p", "first": True}}}, "extract.fields.price.first"),
        ({"links": {"allow": ["ok", "[bad"]}}, "extract.links.allow"),
        ({"links": {"deny": ["*"]}}, "extract.links.deny"),
        ({"links": {"max_depth": -1}}, "extract.links.max_depth"),
        ({"link": {}}, "extract.link"),
    ],
)
def test_a_bad_selector_regex_or_key_is_a_config_error_naming_the_key(
    config: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError) as err:
        ExtractionRules.from_config(config, file="crawl.yaml")
    assert err.value.key == key
    assert err.value.file == "crawl.yaml"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x01<title>a\x00b</title><p>x\x00</p>",
        bytes(range(256)) * 10,
        b"<div>" * 100_000 + b"<p>deep</p>",
        b"\xef\xbb\xbf<title>bom</title>",
        b'<?xml version="1.0" encoding="utf-8"?><title>x</title>',
    ],
    ids=["empty", "nul-bytes", "binary", "deep-nesting", "bom", "xml-declaration"],
)
def test_hostile_bodies_give_a_result_not_a_crash(body: bytes) -> None:
    ex = rules({"t": {"css": "title::text"}, "p": {"xpath": "//p/text()"}})
    got = ex.extract(body, URL)
    assert set(got.fields) == {"t", "p"}
    assert got.title is None or "\x00" not in got.title

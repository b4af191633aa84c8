"""Sitemaps: parsed as a stream (urlset, index, gzip, plain text, hostile XML refused or
defused), found through robots.txt or /sitemap.xml, and seeding ``crawlhub crawl`` with
``--sitemaps`` / ``--sitemaps-only`` on a real local site; a large index read in bounded
memory."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from crawlhub.agents.sitemaps import SitemapParser, parse_lastmod, unchanged_since
from crawlhub.app.crawl import Crawl, CrawlOptions
from tests.agents.servers import Site
from tests.agents.test_crawl import rows

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def urlset(urls: list[str], lastmod: str | None = None) -> bytes:
    entries = "".join(
        f"<url><loc>{u}</loc>{f'<lastmod>{lastmod}</lastmod>' if lastmod else ''}</url>"
        for u in urls)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>{entries}</urlset>'.encode()


def index(sitemaps: list[str]) -> bytes:
    entries = "".join(f"<sitemap><loc>{u}</loc></sitemap>" for u in sitemaps)
    return f'<?xml version="1.0"?><sitemapindex {NS}>{entries}</sitemapindex>'.encode()


def parse(body: bytes, chunk: int = 7) -> tuple[list[Any], list[Any], str]:
    """Feed ``body`` in small chunks, as a network would."""
    parser = SitemapParser()
    pages: list[Any] = []
    children: list[Any] = []
    for i in range(0, len(body), chunk):
        got = parser.feed(body[i:i + chunk])
        pages += got[0]
        children += got[1]
    got = parser.close()
    return pages + got[0], children + got[1], parser.kind


# --- parsing ---------------------------------------------------------------------------


def test_a_urlset_fed_in_pieces_gives_each_loc_with_its_lastmod_as_epoch_seconds() -> None:
    body = (f'<urlset {NS} xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">'
            "<url><loc> http://s.test/a?x=1&amp;y=2 </loc><lastmod>2024-05-01</lastmod>"
            "<image:image><image:loc>http://s.test/a.png</image:loc></image:image></url>"
            "<!-- <url><loc>http://s.test/commented</loc></url> -->"
            "<url><loc>http://s.test/b</loc><lastmod>2024-05-01T12:00:00+02:00</lastmod></url>"
            "<url><loc>http://s.test/c</loc><lastmod>yesterday</lastmod></url></urlset>").encode()
    pages, children, kind = parse(body)
    assert kind == "urlset" and children == []
    assert [(p.url, p.lastmod) for p in pages] == [
        ("http://s.test/a?x=1&y=2", 1714521600),
        ("http://s.test/b", 1714557600),
        ("http://s.test/c", None),
    ]


def test_an_index_gives_its_sitemaps_and_a_gzip_sitemap_is_inflated_as_it_arrives() -> None:
    _, children, kind = parse(index(["http://s.test/1.xml.gz", "http://s.test/2.xml"]))
    assert kind == "sitemapindex"
    assert [c.url for c in children] == ["http://s.test/1.xml.gz", "http://s.test/2.xml"]
    pages, _, _ = parse(gzip.compress(urlset([f"http://s.test/{i}" for i in range(500)])))
    assert [p.url for p in pages] == [f"http://s.test/{i}" for i in range(500)]


def test_a_plain_text_sitemap_gives_one_url_a_line() -> None:
    pages, _, kind = parse(b"http://s.test/a\r\n\nnot a url\nhttps://s.test/b")
    assert kind == "text" and [p.url for p in pages] == ["http://s.test/a", "https://s.test/b"]


@pytest.mark.parametrize("body, why", [
    (b"<html><body>not found</body></html>", "not a sitemap"),
    (b"<urlset><url><loc>http://s.test/a</loc>", "not well-formed"),
    (b"\x1f\x8b\x08\x00garbage", "not valid gzip"),
])
def test_what_is_not_a_sitemap_is_an_error_saying_why(body: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse(body)


def test_external_entities_are_not_resolved_and_a_gzip_bomb_stops_at_the_size_limit(
        tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    body = (f'<?xml version="1.0"?><!DOCTYPE u [<!ENTITY s SYSTEM "file://{secret}">]>'
            f"<urlset {NS}><url><loc>http://s.test/&s;</loc></url></urlset>").encode()
    try:
        pages, _, _ = parse(body)
    except ValueError:
        pages = []
    assert all("TOP-SECRET" not in p.url for p in pages)
    bomb = gzip.compress(b"<urlset>" + b" " * (8 * 1024 * 1024))
    parser = SitemapParser(max_bytes=1024 * 1024)
    with pytest.raises(ValueError, match="larger than"):
        parser.feed(bomb)


def test_lastmod_tells_the_recrawl_whether_a_page_changed_since_its_fetch() -> None:
    when = parse_lastmod("2024-05-01T00:00:00Z")
    assert when == 1714521600
    assert unchanged_since({"url": "u", "lastmod": when}, fetched_at=when + 60)
    assert not unchanged_since({"url": "u", "lastmod": when}, fetched_at=when - 60)
    assert not unchanged_since({"url": "u"}, fetched_at=when)


# --- on a real local site ----------------------------------------------------------------


class SitemapSite(Site):
    """The test site (``/page/{n}``, a link graph) plus sitemaps: robots.txt names
    ``/maps/index.xml`` (``robots_sitemaps``), an index of a gzip sitemap and a plain one
    listing ``listed`` pages (with a lastmod), one URL of another site and one sitemap
    that answers 404."""

    def __init__(self, pages: int, listed: list[int], *, robots_sitemaps: bool = True) -> None:
        super().__init__(pages=pages)
        self.listed = listed
        self.robots_sitemaps = robots_sitemaps
        r = self.app.router
        r.add_get("/robots.txt", self.robots)
        r.add_get("/maps/index.xml", self.index)
        r.add_get("/maps/a.xml.gz", self.part_a)
        r.add_get("/maps/b.xml", self.part_b)
        r.add_get("/sitemap.xml", self.fallback)

    async def robots(self, request: web.Request) -> web.Response:
        lines = "User-agent: *\nDisallow:\n"
        if self.robots_sitemaps:
            lines += f"Sitemap: {self.url}/maps/index.xml\n"
        return web.Response(text=lines)

    async def index(self, request: web.Request) -> web.Response:
        return web.Response(body=index([f"{self.url}/maps/a.xml.gz", f"{self.url}/maps/b.xml",
                                        f"{self.url}/maps/missing.xml"]),
                            content_type="application/xml")

    def _half(self, k: int) -> list[str]:
        return [f"{self.url}/page/{n}" for n in self.listed[k::2]]

    async def part_a(self, request: web.Request) -> web.Response:
        body = urlset(self._half(0) + ["http://elsewhere.test/x"], lastmod="2024-05-01")
        return web.Response(body=gzip.compress(body), content_type="application/gzip")

    async def part_b(self, request: web.Request) -> web.Response:
        return web.Response(body=urlset(self._half(1), lastmod="2024-05-01"),
                            content_type="application/xml")

    async def fallback(self, request: web.Request) -> web.Response:
        return web.Response(body=urlset(self._half(0)), content_type="application/xml")


async def test_sitemaps_only_crawls_every_listed_url_and_nothing_else(tmp_path: Path) -> None:
    listed = [3, 17, 42, 58, 77]
    async with SitemapSite(pages=100, listed=listed) as site:
        out = tmp_path / "items.jsonl"
        opts = CrawlOptions(urls=[f"{site.url}/"], out=out, data_dir=tmp_path / "data",
                            follow=True, sitemaps_only=True, concurrency=4)
        progress = await Crawl(opts).run()
        assert sorted(r["url"] for r in rows(out)) == sorted(
            f"{site.url}/page/{n}" for n in listed)
        assert {r["title"] for r in rows(out)} == {f"Page {n}" for n in listed}
        assert site.hits["/"] == 0 and site.hits["/maps/a.xml.gz"] == 1
        report = progress.sitemaps
        assert report is not None
        assert report.sitemaps == 4 and report.urls == 5 and report.left_out == 1
        assert list(report.failures) == [f"{site.url}/maps/missing.xml"]
        assert "404" in report.failures[f"{site.url}/maps/missing.xml"]


async def test_sitemaps_add_the_listed_pages_to_a_crawl_that_follows_links_and_read_them_once(
        tmp_path: Path) -> None:
    # page/N links only to pages 1..10 and back: 40 is reachable only through the sitemap
    async with SitemapSite(pages=11, listed=[5], robots_sitemaps=False) as site:
        site.pages = 41
        out = tmp_path / "items.jsonl"
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=tmp_path / "data",
                            follow=True, depth=0, sitemaps=True, concurrency=4)
        await Crawl(opts).run()
        # no Sitemap: line in robots.txt: /sitemap.xml is read
        assert site.hits["/sitemap.xml"] == 1
        assert sorted(r["url"] for r in rows(out)) == [f"{site.url}/page/0",
                                                       f"{site.url}/page/5"]
        # a resumed crawl does not read them again (its frontier has them)
        await Crawl(opts).run()
        assert site.hits["/sitemap.xml"] == 1


async def test_seeded_tasks_carry_the_sitemaps_lastmod_and_honour_exclude_patterns(
        tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.tasks: list[dict[str, Any]] = []

        async def submit(self, tasks: list[dict[str, Any]], wait: bool = False) -> None:
            self.tasks += tasks

    async with SitemapSite(pages=100, listed=[1, 2, 3, 4]) as site:
        hub = Recorder()
        (tmp_path / "data").mkdir()
        crawl = Crawl(CrawlOptions(urls=[f"{site.url}/maps/b.xml"], out=tmp_path / "o",
                                   data_dir=tmp_path / "data", deny=["/page/4$"]))
        await crawl._seed_sitemaps(hub)
        assert hub.tasks == [{"url": f"{site.url}/page/2", "depth": 0,
                              "lastmod": 1714521600}]
        assert crawl.progress.sitemaps is not None
        assert crawl.progress.sitemaps.left_out == 1


MEMORY_PROBE = r"""
import asyncio, gzip, resource, sys
from aiohttp import web
from crawlhub.agents.sitemaps import http_chunks, read_sitemaps

PARTS, PER = int(sys.argv[1]), 50_000

async def index(request):
    body = "".join(f"<sitemap><loc>http://127.0.0.1:{port}/s/{i}.xml.gz</loc></sitemap>"
                   for i in range(PARTS))
    return web.Response(text=f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/'
                             f'sitemap/0.9">{body}</sitemapindex>')

def make_part(port):
    return gzip.compress(("<urlset xmlns='http://www.sitemaps.org/schemas/sitemap/0.9'>"
        + "".join(f"<url><loc>http://127.0.0.1:{port}/p/{k}</loc><lastmod>2024-05-01</lastmod>"
                  "</url>" for k in range(PER)) + "</urlset>").encode(), 1)

async def part(request):
    return web.Response(body=PART, content_type="application/gzip")

async def main():
    global port
    app = web.Application()
    app.router.add_get("/index.xml", index)
    app.router.add_get("/s/{i}.xml.gz", part)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    global PART
    PART = make_part(port)
    seen, warm = 0, None
    async for batch in read_sitemaps([f"http://127.0.0.1:{port}/index.xml"],
                                     fetch=http_chunks("probe")):
        seen += len(batch)
        if warm is None and seen >= PER:
            warm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(seen, warm, peak)
    await runner.cleanup()

asyncio.run(main())
"""


def test_a_large_sitemap_index_is_read_in_bounded_memory(tmp_path: Path) -> None:
    # an index of 3 gzip sitemaps of 50,000 URLs (the protocol's maximum each): the peak
    # RSS once all 150,000 are read is the peak after the first 50,000, give or take
    # allocator noise (holding the other 100,000 would take ~25 MB more).
    # bench/sitemaps.py reads a 1,000,000-URL index the same way.
    probe = tmp_path / "probe.py"
    probe.write_text(MEMORY_PROBE)
    done = subprocess.run([sys.executable, str(probe), "3"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seen, warm, peak = (int(x) for x in done.stdout.split())
    assert seen == 150_000
    assert (peak - warm) / 1024 < 8, f"RSS grew {(peak - warm) / 1024:.1f} MB"

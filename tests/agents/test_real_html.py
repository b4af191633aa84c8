"""Real HTML nobody here wrote: the Python documentation of Debian's ``python3-doc``
package, served on 127.0.0.1. ``crawlhub crawl`` finds every page reachable from its
index - the expected set computed here independently, by a breadth-first walk over the
files with lxml - with the titles lxml reads, each page once, and never a page robots.txt
disallows."""

from __future__ import annotations

import glob
import gzip
import os
from collections import deque
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import pytest
from aiohttp import web
from lxml import html as lxml_html

from crawlhub.app.crawl import Crawl, CrawlOptions
from tests.agents.test_crawl import rows

#: A subtree the test's robots.txt disallows.
DISALLOWED = "/c-api/"


def python_docs() -> Path:
    """The Python documentation's HTML root, installed by Debian's ``python3-doc``."""
    for found in sorted(glob.glob("/usr/share/doc/python3*/html/library/index.html")):
        return Path(found).parent.parent.resolve()
    pytest.fail("Debian's python3-doc is not installed (no /usr/share/doc/python3*/html/"
                "library/index.html): `apt-get install -y python3-doc` (.ci/run does)")


def expected_pages(root: Path, base: str) -> dict[str, str]:
    """URL -> title of every HTML page reachable from ``index.html`` through ``<a href>``
    on the same site, robots' subtree left out, walked over the files."""
    found: dict[str, str] = {}
    todo = deque([f"{base}/index.html"])
    seen = set(todo)
    while todo:
        url = todo.popleft()
        path = root / unquote(urlsplit(url).path).lstrip("/")
        if path.suffix != ".html":
            continue
        if path.is_file():
            doc = lxml_html.parse(str(path)).getroot()
        elif path.with_name(path.name + ".gz").is_file():  # the server sends it gzipped
            doc = lxml_html.fromstring(gzip.decompress(path.with_name(path.name + ".gz")
                                                      .read_bytes()))
        else:
            continue
        found[url] = " ".join((doc.findtext(".//title") or "").split())
        for href in doc.xpath("//a/@href"):
            link = urldefrag(urljoin(url, href.strip()))[0]
            if not link.startswith(f"{base}/") or urlsplit(link).path.startswith(DISALLOWED):
                continue
            if link not in seen:
                seen.add(link)
                todo.append(link)
    return found


async def test_the_python_docs_are_crawled_whole_with_titles_once_each_robots_honoured(
        tmp_path: Path) -> None:
    root = python_docs()
    app = web.Application()
    robots_asked: list[str] = []

    async def robots(request: web.Request) -> web.Response:
        robots_asked.append(request.path)
        return web.Response(text=f"User-agent: *\nDisallow: {DISALLOWED}\n")

    requested: list[str] = []

    @web.middleware
    async def log(request: web.Request, handler):  # type: ignore[no-untyped-def]
        requested.append(request.path)
        return await handler(request)

    app.middlewares.append(log)
    app.router.add_get("/robots.txt", robots)
    app.router.add_static("/", root)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    try:
        out = tmp_path / "items.jsonl"
        progress = await Crawl(CrawlOptions(urls=[f"{base}/index.html"], out=out,
                                            data_dir=tmp_path / "data", follow=True,
                                            concurrency=16)).run()
    finally:
        await runner.cleanup()
    expected = expected_pages(root, base)
    assert len(expected) > 300  # the docs, not an empty tree
    items = rows(out)
    urls = [r["url"] for r in items]
    assert len(urls) == len(set(urls)), "a page was written twice"
    pages = {r["url"]: r["title"] for r in items if r["url"].endswith(".html")}
    assert set(pages) == set(expected)
    assert pages == expected
    # what else was written is the few non-HTML files the pages link to
    assert all(os.path.splitext(u)[1] != ".html" for u in set(urls) - set(pages))
    assert not [p for p in requested if p.startswith(DISALLOWED)]
    assert progress.robots > 0 and robots_asked == ["/robots.txt"]
    assert progress.errors == 0

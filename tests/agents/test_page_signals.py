"""The page's own signals in ``crawlhub crawl``, on a real local site: charsets (header,
BOM, ``<meta>``, undeclared: detected), ``<link rel=canonical>``, ``<meta name=robots>``
and ``X-Robots-Tag``, ``<meta http-equiv=refresh>``, ``<base href>``, binaries neither
parsed nor (by extension) fetched, and ``--max-pages`` / ``--max-depth`` /
``--include`` / ``--exclude``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from typer.testing import CliRunner

from crawlhub.agents.extract import ExtractionRules
from crawlhub.app.crawl import Crawl, CrawlOptions
from tests.agents.servers import Site
from tests.agents.test_crawl import rows

#: Long enough for charset detection to be sure of an undeclared page.
TEXTS = {
    "gb18030": ("北京欢迎你", "中华人民共和国是世界上人口最多的国家之一。长城是中国古代的伟大建筑，"
                "每年吸引成千上万的游客前来参观。我们今天去博物馆看历史文物。"),
    "shift_jis": ("東京へようこそ", "日本の首都は東京です。富士山は日本で一番高い山で、"
                  "毎年たくさんの人が登ります。私たちは明日、京都の古いお寺を見に行きます。"),
    "windows-1251": ("Добро пожаловать в Москву", "Москва является столицей России и"
                     " крупнейшим городом страны. Каждый год миллионы туристов посещают"
                     " Красную площадь, Кремль и многочисленные музеи этого города."),
}


def charset_page(encoding: str, how: str) -> tuple[bytes, str]:
    """A page in ``encoding`` declared by ``how`` (header, meta, bom, none): body and
    Content-Type."""
    title, text = TEXTS[encoding]
    meta = f'<meta charset="{encoding}">' if how == "meta" else ""
    page = (f"<!DOCTYPE html><html><head>{meta}<title>{title}</title></head>"
            f"<body><p>{text}</p><p>{text}</p></body></html>")
    if how == "bom":  # a BOM says UTF-8 whatever the header claims
        return b"\xef\xbb\xbf" + page.encode("utf-8"), "text/html; charset=iso-8859-1"
    body = page.encode(encoding)
    if how == "header":
        return body, f"text/html; charset={encoding}"
    return body, "text/html"


class SignalSite(Site):
    """The test site plus pages showing each signal; ``/`` links to all of them."""

    def __init__(self) -> None:
        super().__init__(pages=30)
        self.routes: dict[str, tuple[bytes, str, dict[str, str]]] = {}
        links = []
        for encoding in TEXTS:
            for how in ("header", "meta", "bom", "none"):
                path = f"/charset/{encoding}/{how}"
                body, ctype = charset_page(encoding, how)
                self.routes[path] = (body, ctype, {})
                links.append(path)

        def html(path: str, head: str, body: str, headers: dict[str, str] | None = None) -> None:
            page = f"<html><head><title>{path}</title>{head}</head><body>{body}</body></html>"
            self.routes[path] = (page.encode(), "text/html; charset=utf-8", headers or {})
            links.append(path)

        canonical = '<link rel="canonical" href="/article">'
        html("/article", canonical, "the article")
        html("/article-print", canonical, "the article, printable")
        html("/article-amp", '<link href="/article?amp=0" rel="alternate canonical">', "amp")
        html("/elsewhere", '<link rel=canonical href="http://other.test/x">', "off-site")
        html("/noindex", '<meta name="robots" content="noindex">', '<a href="/page/1">1</a>')
        html("/nofollow", '<META NAME="ROBOTS" CONTENT="index, nofollow">',
             '<a href="/page/2">2</a>')
        html("/header-noindex", "", '<a href="/page/3">3</a>', {"X-Robots-Tag": "noindex"})
        html("/header-other-bot", "", "", {"X-Robots-Tag": "otherbot: noindex"})
        html("/refresh", '<meta http-equiv="refresh" content="0; url=/page/4">', "moved")
        html("/based", '<base href="/deep/dir/">', '<a href="leaf">leaf</a>')
        html("/deep/dir/leaf", "", "a leaf")
        html("/binaries", "", '<a href="/file.pdf">pdf</a> <a href="/photo.JPG?s=1">jpg</a>'
                              ' <a href="/image">image</a>')
        self.routes["/file.pdf"] = (b"%PDF-1.4", "application/pdf", {})
        self.routes["/image"] = (b'\x89PNG\r\n<title>no</title><a href="/page/5">x</a>',
                                 "image/png", {})
        index = "".join(f'<a href="{p}">{p}</a>' for p in links)
        self.routes["/"] = (f"<html><head><title>home</title></head><body>{index}</body>"
                            "</html>".encode(), "text/html", {})
        for path in self.routes:
            self.app.router.add_get(path, self.serve)

    async def serve(self, request: web.Request) -> web.Response:
        body, ctype, headers = self.routes[request.path]
        return web.Response(body=body, headers={"Content-Type": ctype, **headers})


def by_url(out: Path) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for row in rows(out):
        assert row["url"] not in found, f"{row['url']} written twice"
        found[row["url"]] = row
    return found


async def crawl(site: SignalSite, tmp_path: Path, **options: Any) -> tuple[Any, dict[str, Any]]:
    out = tmp_path / "items.jsonl"
    opts = CrawlOptions(urls=[f"{site.url}/"], out=out, data_dir=tmp_path / "data",
                        follow=True, depth=2, concurrency=8, **options)
    progress = await Crawl(opts).run()
    return progress, by_url(out)


async def test_the_crawl_honours_each_signal_a_page_gives(tmp_path: Path) -> None:
    async with SignalSite() as site:
        progress, items = await crawl(site, tmp_path)
        u = site.url
        # charsets: header, BOM, <meta> and undeclared (detected) all decode right
        for encoding, (title, _) in TEXTS.items():
            for how in ("header", "meta", "bom", "none"):
                assert items[f"{u}/charset/{encoding}/{how}"]["title"] == title, (encoding, how)
        # canonical: copies write one item under the canonical URL; another host's is ignored
        # (whichever copy came first: the other is a duplicate, not a second item)
        assert items[f"{u}/article"]["title"] in ("/article", "/article-print")
        assert {items[f"{u}/article?amp=0"]["fetched_url"]} == {f"{u}/article-amp"}
        assert f"{u}/article-print" not in items and f"{u}/elsewhere" in items
        # noindex: fetched, no item, its links followed; nofollow: an item, no links
        assert f"{u}/noindex" not in items and f"{u}/page/1" in items
        assert f"{u}/nofollow" in items and site.hits["/page/2"] == 0
        assert f"{u}/header-noindex" not in items and f"{u}/page/3" in items
        assert f"{u}/header-other-bot" in items
        assert progress.noindex == 2
        # refresh and base href lead on
        assert f"{u}/page/4" in items and f"{u}/deep/dir/leaf" in items
        # binaries: by extension never fetched; by Content-Type fetched, not parsed
        assert site.hits["/file.pdf"] == 0 and site.hits["/photo.JPG"] == 0
        assert items[f"{u}/image"]["title"] is None and site.hits["/page/5"] == 0
        assert progress.errors == 0


async def test_no_canonical_writes_each_copy_under_its_own_url(tmp_path: Path) -> None:
    async with SignalSite() as site:
        _, items = await crawl(site, tmp_path, canonical=False)
        assert {f"{site.url}/article", f"{site.url}/article-print"} <= set(items)
        assert not any("fetched_url" in row for row in items.values())


async def test_max_pages_fetches_exactly_that_many_and_the_same_command_goes_on(
        tmp_path: Path) -> None:
    async with Site(pages=60) as site:
        out = tmp_path / "items.jsonl"
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=tmp_path / "data",
                            follow=True, concurrency=8, max_pages=10)
        first = await Crawl(opts).run()
        assert first.limited and first.pages == 10 and len(rows(out)) == 10
        assert sum(n for path, n in site.hits.items() if path.startswith("/page/")) == 10
        second = await Crawl(opts).run()
        assert second.pages == 10 and len({r["url"] for r in rows(out)}) == 20
        assert max(n for path, n in site.hits.items() if path.startswith("/page/")) == 1


async def test_include_exclude_and_max_depth_filter_what_is_followed(tmp_path: Path) -> None:
    async with Site(pages=200) as site:
        out = tmp_path / "items.jsonl"
        # page n links to 10n+1..10n+10: depth 2 from page 0 reaches 0..110
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=tmp_path / "data",
                            follow=True, concurrency=8, depth=2, allow=[r"/page/\d+$"],
                            deny=[r"/page/\d*7$"])
        await Crawl(opts).run()
        got = {int(r["url"].rsplit("/", 1)[1]) for r in rows(out)}
        # (excluded pages are not fetched, so 7's children 71..80 are never found)
        assert got == {n for n in range(111) if n % 10 != 7 and not 71 <= n <= 80}


def test_the_cli_flags_reach_the_crawl(tmp_path: Path) -> None:
    import asyncio
    import threading

    ready = threading.Event()
    holder: dict[str, Any] = {}

    def serve() -> None:
        async def main() -> None:
            async with Site(pages=50) as site:
                holder["site"] = site
                holder["stop"] = stop = asyncio.Event()
                holder["loop"] = asyncio.get_running_loop()
                ready.set()
                await stop.wait()
        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    site = holder["site"]
    try:
        from crawlhub.cli import app

        out = tmp_path / "items.jsonl"
        result = CliRunner().invoke(app, [
            "crawl", f"{site.url}/page/0", "--follow", "--max-depth", "3", "--max-pages", "7",
            "--include", "/page/", "--exclude", "/page/3$", "--no-canonical", "--quiet",
            "--out", str(out), "--data-dir", str(tmp_path / "data")])
        assert result.exit_code == 0, result.output
        assert len(rows(out)) == 7 and "--max-pages 7" in result.output
        assert f"{site.url}/page/3" not in {r["url"] for r in rows(out)}
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)


def test_charset_detection_is_only_the_fallback() -> None:
    # a page whose header names its charset is decoded with it, even if it looks like
    # another; one with none is read as UTF-8 first (valid UTF-8 is never "detected")
    rules = ExtractionRules()
    body = "<title>Привет</title>".encode()
    assert rules.extract(body, "http://s.test/", content_type="text/html").title == "Привет"
    cp = "<title>Привет</title>".encode("windows-1251")
    got = rules.extract(cp, "http://s.test/", content_type="text/html; charset=koi8-r").title
    assert got == "Привет".encode("windows-1251").decode("koi8-r")

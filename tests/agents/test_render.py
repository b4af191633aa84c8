"""Browser rendering (``agents.browser``, ``crawlhub crawl --render``) in real Chromium.

Debian's ``chromium`` (``/usr/bin/chromium`` or ``$CRAWLHUB_CHROMIUM``) through Playwright:
pages whose links and content exist only after their scripts ran are crawled from the DOM
they built; images, fonts and media are blocked; waits; cookies shared with the HTTP
session; a killed browser is replaced and no page is lost; contexts and browsers are
recycled. Sites are real local servers. One browser serves the tests that need no
configuration of their own (it starts once for the module).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from crawlhub.agents.agent import Agent, CrawledPage, HubReport, link_tasks
from crawlhub.agents.browser import CHROMIUM, BrowserDownloader, RenderConfig, RenderWait
from crawlhub.agents.downloader import Downloader
from crawlhub.agents.extract import ExtractionRules, RuleSets
from crawlhub.app.crawl import Crawl, CrawlOptions
from crawlhub.demo import DemoConfig, create_app
from crawlhub.demo.site import js_price, js_title
from crawlhub.services import Services
from tests.agents.servers import _Server
from tests.agents.test_agent import config, run_until_idle
from tests.agents.test_task_rules import page
from tests.helpers import wait_for

#: the async tests share the module's loop: its fixtures (one browser) live there
module_loop = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "apt-get install chromium (or set CRAWLHUB_CHROMIUM) and pip install -e .[dev]"


def require_browser() -> None:
    """The tests need the browser and Playwright: say how to get them, never skip."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        pytest.fail(f"the playwright package is missing: {INSTALL}", pytrace=False)
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) \
            and not shutil.which(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: {INSTALL}", pytrace=False)


class Pages(_Server):
    """Pages for the browser: assets to block, late content, cookies both ways."""

    def __init__(self) -> None:
        super().__init__()
        self.assets: Counter[str] = Counter()
        self.app.router.add_get("/media", self.media)
        self.app.router.add_get("/asset/{name}", self.asset)
        self.app.router.add_get("/late", self.late)
        self.app.router.add_get("/login", self.login)
        self.app.router.add_get("/logout", self.logout)
        self.app.router.add_get("/whoami", self.whoami)
        self.app.router.add_get("/seen", self.seen)
        self.app.router.add_get("/agent", self.agent)

    async def media(self, request: web.Request) -> web.Response:
        return _html("media", '<img src="/asset/a.png">'
                     '<style>@font-face {font-family: F; src: url(/asset/f.woff2)}'
                     ' p {font-family: F}</style><p>text</p>'
                     '<video src="/asset/v.mp4" preload="auto" autoplay muted></video>')

    async def asset(self, request: web.Request) -> web.Response:
        self.assets[request.match_info["name"]] += 1
        return web.Response(body=b"\0" * 64, content_type="application/octet-stream")

    async def late(self, request: web.Request) -> web.Response:
        return _html("late", '<div id="app"></div><script>setTimeout(function () {'
                     ' var p = document.createElement("p"); p.className = "price";'
                     ' p.textContent = "9.99"; document.getElementById("app").appendChild(p);'
                     ' }, 300);</script>')

    async def login(self, request: web.Request) -> web.Response:
        response = _html("login", "<p>logged in</p>")
        response.set_cookie("sid", "abc123")
        return response

    async def logout(self, request: web.Request) -> web.Response:
        response = _html("logout", "<p>logged out</p>")
        response.del_cookie("sid")
        return response

    async def whoami(self, request: web.Request) -> web.Response:
        """Shows the cookies it got; sets one by header and one by script."""
        got = ";".join(f"{k}={v}" for k, v in sorted(request.cookies.items()))
        response = _html("whoami", f'<p id="got">{got}</p>'
                         '<script>document.cookie = "js=set-by-script; path=/";</script>')
        response.set_cookie("srv", "set-by-header")
        return response

    async def seen(self, request: web.Request) -> web.Response:
        got = ";".join(f"{k}={v}" for k, v in sorted(request.cookies.items()))
        return _html("seen", f'<p id="got">{got}</p>')

    async def agent(self, request: web.Request) -> web.Response:
        """Shows the User-Agent and the X-Team header it got, with the cookies."""
        got = ";".join(f"{k}={v}" for k, v in sorted(request.cookies.items()))
        return _html("agent", f'<p id="ua">{request.headers.get("User-Agent")}</p>'
                              f'<p id="team">{request.headers.get("X-Team")}</p>'
                              f'<p id="got">{got}</p>')


def _html(title: str, body: str) -> web.Response:
    return web.Response(text=f"<!doctype html><html><head><title>{title}</title></head>"
                             f"<body>{body}</body></html>", content_type="text/html")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pages() -> AsyncIterator[Pages]:
    async with Pages() as site:
        yield site


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[Downloader]:
    async with Downloader() as downloader:
        yield downloader


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def browser(http: Downloader) -> AsyncIterator[BrowserDownloader]:
    require_browser()
    async with BrowserDownloader(RenderConfig(concurrency=2, timeout=20), cookies=http) as b:
        await b.start()
        yield b


class Demo(_Server):
    """``crawlhub demo``'s application: its JavaScript shop of ``js_pages`` pages."""

    def __init__(self, js_pages: int, latency: float = 0.0) -> None:
        super().__init__()
        self.app = create_app(DemoConfig(js_pages=js_pages, grow_every=0, items=0,
                                         latency=(latency, latency)))


# --------------------------------------------------------------------------- the DOM
@module_loop
async def test_a_rendered_crawl_takes_links_and_fields_from_the_dom_the_scripts_built(
        tmp_path: Path) -> None:
    require_browser()
    async with Demo(js_pages=12) as demo:
        plain = await Crawl(CrawlOptions(urls=[f"{demo.url}/js/"], out=tmp_path / "plain.jsonl",
                                         data_dir=tmp_path / "plain", follow=True)).run()
        # over HTTP the shell has no link: one page, its title the placeholder
        assert plain.pages == 1
        assert _items(tmp_path / "plain.jsonl")[0]["title"] == "Loading..."
        opts = CrawlOptions(urls=[f"{demo.url}/js/"], out=tmp_path / "items.jsonl",
                            data_dir=tmp_path / "data", follow=True, render=True,
                            render_concurrency=2, wait_for="#app[data-ready]",
                            extract={"fields": {"price": {"css": ".price::text"}}})
        progress = await Crawl(opts).run()
    items = _items(tmp_path / "items.jsonl")
    by_url = {i["url"]: i for i in items}
    assert progress.errors == 0
    assert len(items) == len(by_url) == 13  # /js/ and /js/p/0 to /js/p/11
    for n in range(12):
        item = by_url[f"{demo.url}/js/p/{n}"]
        assert (item["title"], item["price"]) == (js_title(n), js_price(n))


@module_loop
async def test_tasks_are_rendered_when_they_or_their_named_rules_say_so_and_fetched_otherwise(
        tmp_path: Path) -> None:
    require_browser()
    rules = RuleSets(ExtractionRules(),
                     {"spa": ExtractionRules.from_config({"render": {"wait_for": ".price"}})})
    titles: dict[str, str | None] = {}

    async def keep(done: list[CrawledPage]) -> None:
        for one in done:
            assert one.extracted is not None, one.fetched.error
            titles[str(one.task["url"]).rsplit("?", 1)[1]] = one.extracted.title

    async with Demo(js_pages=3) as demo:
        services = await Services.open(config(tmp_path))
        try:
            url = f"{demo.url}/js/p/1"
            await services.hub.submit([{"url": f"{url}?http"},
                                       {"url": f"{url}?task", "render": True},
                                       {"url": f"{url}?rule", "extract": "spa"},
                                       {"url": f"{url}?off", "extract": "spa", "render": False}])
            async with Downloader() as downloader:
                agent = Agent({"pages": services.queues.queue("pages")}, downloader,
                              report=HubReport(services.hub, "http"), rules=rules,
                              on_pages=keep, concurrency=4)
                await run_until_idle(services, agent)
                assert agent.browser is not None and agent.browser.stats()["browser/pages"] == 2
        finally:
            await services.close()
    rendered = js_title(1)
    assert titles == {"http": "Loading...", "task": rendered, "rule": rendered,
                      "off": "Loading..."}


def test_the_links_of_a_page_whose_task_says_render_are_rendered_too() -> None:
    wait = {"wait_for": "#app"}
    pages = [page({"url": "http://s/a"}, ["http://s/1"]),
             page({"url": "http://s/b", "render": wait}, ["http://s/2"])]
    assert link_tasks({"http://s/1": 1, "http://s/2": 1}, pages) == [
        {"url": "http://s/1", "depth": 1},
        {"url": "http://s/2", "depth": 1, "render": wait},
    ]


# ------------------------------------------------------------------ blocking and waits
@module_loop
async def test_images_fonts_and_media_are_blocked_by_default_and_load_when_block_is_empty(
        pages: Pages, browser: BrowserDownloader) -> None:
    fetched = await browser.fetch(f"{pages.url}/media")
    assert fetched.ok and b"<video" in fetched.body
    assert sum(pages.assets.values()) == 0
    async with BrowserDownloader(RenderConfig(block=[], timeout=20)) as everything:
        assert (await everything.fetch(f"{pages.url}/media")).ok
    assert pages.assets["a.png"] >= 1


@module_loop
async def test_a_selector_wait_sees_content_written_after_load_and_a_missing_one_times_out(
        pages: Pages, browser: BrowserDownloader) -> None:
    at_load = await browser.fetch(f"{pages.url}/late", wait=RenderWait(wait_until="load"))
    assert at_load.ok and b"<p class=\"price\">" not in at_load.body
    waited = await browser.fetch(f"{pages.url}/late", wait=RenderWait(wait_for="p.price"))
    assert waited.ok and b'<p class="price">9.99</p>' in waited.body
    async with BrowserDownloader(RenderConfig(timeout=1.5)) as impatient:
        missing = await impatient.fetch(f"{pages.url}/late", wait=RenderWait(wait_for="#never"))
    assert missing.outcome == "timeout"
    assert "'#never'" in missing.error


# ----------------------------------------------------------------------------- cookies
@module_loop
async def test_cookies_go_from_the_http_session_to_the_browser_and_back(
        pages: Pages, http: Downloader, browser: BrowserDownloader) -> None:
    assert (await http.fetch(f"{pages.url}/login", job="shop")).ok
    rendered = await browser.fetch(f"{pages.url}/whoami", job="shop")
    assert b'<p id="got">sid=abc123</p>' in rendered.body
    assert http.cookies("shop") == {"sid": "abc123", "srv": "set-by-header",
                                    "js": "set-by-script"}
    after = await http.fetch(f"{pages.url}/seen", job="shop")
    assert b"js=set-by-script;sid=abc123;srv=set-by-header" in after.body
    # another job's pages see none of them
    other = await browser.fetch(f"{pages.url}/seen", job="other")
    assert b'<p id="got"></p>' in other.body
    # a cookie the HTTP session dropped is gone from the job's pages too; the rest stay
    assert (await http.fetch(f"{pages.url}/logout", job="shop")).ok
    out = await browser.fetch(f"{pages.url}/seen", job="shop")
    assert b'<p id="got">js=set-by-script;srv=set-by-header</p>' in out.body


@module_loop
async def test_jobs_with_downloaders_of_their_own_share_one_browser_and_keep_their_own(
        pages: Pages) -> None:
    # The download center's agent gives each job a downloader of its own (the job's
    # headers, cookie jar, size limit): one browser renders for all of them, each job in
    # a context with its downloader's headers and cookies, and a job that is over
    # (forget) leaves no context behind.
    require_browser()
    before = set(chromium_browsers())
    from crawlhub.agents.config import DownloaderConfig

    a = Downloader(DownloaderConfig(headers={"User-Agent": "team-a/1", "X-Team": "a"}))
    b = Downloader(DownloaderConfig(headers={"User-Agent": "team-b/2", "X-Team": "b"}))
    tiny = Downloader(DownloaderConfig(max_size=100))
    async with a, b, tiny, BrowserDownloader(RenderConfig(concurrency=2, timeout=20)) as pool:
        assert (await a.fetch(f"{pages.url}/login", job="j")).ok  # only a's jar has sid
        got_a, got_b = await asyncio.gather(
            pool.fetch(f"{pages.url}/agent", job="j", http=a),
            pool.fetch(f"{pages.url}/agent", job="j", http=b))  # one job name, two owners
        assert got_a.ok and got_b.ok, (got_a.error, got_b.error)
        assert b'<p id="ua">team-a/1</p><p id="team">a</p><p id="got">sid=abc123</p>' \
            in got_a.body
        assert b'<p id="ua">team-b/2</p><p id="team">b</p><p id="got"></p>' in got_b.body
        # the size limit is the job's downloader's
        assert (await pool.fetch(f"{pages.url}/agent", job="t", http=tiny)).outcome \
            == "too_large"
        # cookies a page sets go to its own downloader's jar only
        assert (await pool.fetch(f"{pages.url}/whoami", job="k", http=b)).ok
        assert b.cookies("k") == {"srv": "set-by-header", "js": "set-by-script"}
        assert a.cookies("k") == {}
        stats = pool.stats()
        # (a context closes with its last page: the 2 pages of the pool made way in turn)
        assert stats["browser/launches"] == 1 and 1 <= stats["browser/contexts"] <= 2
        assert len(set(chromium_browsers()) - before) == 1
        for job, http in (("j", a), ("j", b), ("k", b), ("t", tiny)):
            await pool.forget(job, http)
        assert pool.stats()["browser/contexts"] == 0
        again = await pool.fetch(f"{pages.url}/agent", job="j", http=a)
        assert b"sid=abc123" in again.body  # the jar is a's: a new context gets it again
        assert pool.stats()["browser/launches"] == 1
        assert pool.stats()["browser/contexts"] == 1


# ------------------------------------------------------------------- crash and memory
def chromium_browsers() -> list[int]:
    """This process's Chromium browser processes (not their renderers and helpers)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        parents[int(entry)] = int(ppid)
        if state not in "ZX":  # (an exited process not yet reaped has no command line)
            names[int(entry)] = name
    ours: list[int] = []
    for pid, name in names.items():
        if name != "chromium":
            continue
        up = parents.get(pid, 0)
        while up > 1 and up != os.getpid():
            up = parents.get(up, 0)
        if up != os.getpid():
            continue
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if command and b"--type=" not in command:
                ours.append(pid)
    return ours


@module_loop
async def test_a_killed_browser_is_replaced_and_every_page_reaches_the_items_file(
        tmp_path: Path) -> None:
    require_browser()
    before = set(chromium_browsers())
    async with Demo(js_pages=16, latency=0.05) as demo:
        opts = CrawlOptions(urls=[f"{demo.url}/js/"], out=tmp_path / "items.jsonl",
                            data_dir=tmp_path / "data", follow=True, render=True,
                            render_concurrency=2, wait_for="#app[data-ready]")
        crawl = Crawl(opts)
        run = asyncio.create_task(crawl.run())
        await wait_for(lambda: crawl.progress.items >= 3 or run.done(), "the first items")
        assert not run.done(), "the crawl ended before the browser could be killed"
        [chromium] = set(chromium_browsers()) - before
        os.kill(chromium, signal.SIGKILL)
        progress = await asyncio.wait_for(run, 120)
        stats = crawl.agent.browser.stats()  # type: ignore[union-attr]
    assert stats["browser/crashes"] == 1 and stats["browser/launches"] == 2
    items = _items(tmp_path / "items.jsonl")
    assert sorted(i["url"] for i in items) == sorted(
        {f"{demo.url}/js/", *(f"{demo.url}/js/p/{n}" for n in range(16))})
    assert all(i["title"] == js_title(int(i["url"].rsplit("/", 1)[1] or 0)) for i in items)
    assert progress.errors == 0


@module_loop
async def test_pages_are_recycled_and_a_browser_past_its_quota_is_replaced_and_closed(
        pages: Pages) -> None:
    require_browser()
    before = set(chromium_browsers())
    config = RenderConfig(concurrency=2, recycle_after=2, restart_after=5, timeout=20)
    async with BrowserDownloader(config) as b:
        results = await asyncio.gather(*(b.fetch(f"{pages.url}/seen?{n}") for n in range(12)))
        assert all(r.ok for r in results), [(r.outcome, r.error) for r in results if not r.ok]
        stats = b.stats()
        # (the pages in flight when a browser is retired finish on it)
        assert stats["browser/restarts"] >= 2 and stats["browser/launches"] >= 2
        assert stats["browser/pages_recycled"] >= 5
        # the browsers replaced were closed: one runs now
        await wait_for(lambda: len(set(chromium_browsers()) - before) == 1,
                       "the replaced browsers to close")
    await wait_for(lambda: not set(chromium_browsers()) - before, "the browser to close")


@module_loop
async def test_a_page_opened_while_its_context_loses_its_last_other_page_is_not_closed(
        pages: Pages) -> None:
    # Pages used once each, three at a time in one job's context: a page is often opened
    # in the context while its last other page is being dropped. The drop must not close
    # the context under the new page (its navigation failed: "frame was detached", and
    # the browser was taken for dead and replaced: 1-2 of 60 pages, 3-4 launches).
    require_browser()
    config = RenderConfig(concurrency=3, recycle_after=1, timeout=20)
    async with BrowserDownloader(config) as b:
        results = await asyncio.gather(*(b.fetch(f"{pages.url}/seen?{n}") for n in range(60)))
        assert [(r.outcome, r.error) for r in results if not r.ok] == []
        stats = b.stats()
        assert (stats["browser/launches"], stats["browser/rerenders"]) == (1, 0)
        assert stats["browser/pages_recycled"] == 60


@module_loop
async def test_a_browser_that_stops_answering_is_replaced_and_the_page_rendered_on_another(
        pages: Pages) -> None:
    # A frozen Chromium (SIGSTOP) never opens the page asked for: the wait for it is
    # bounded, the browser retired, and the page rendered on a new one - no render, and
    # so no slot or lock, waits for it forever.
    require_browser()
    before = set(chromium_browsers())
    config = RenderConfig(concurrency=1, recycle_after=1, timeout=3)
    async with BrowserDownloader(config) as b:
        assert (await b.fetch(f"{pages.url}/seen?1")).ok
        [frozen] = set(chromium_browsers()) - before
        os.kill(frozen, signal.SIGSTOP)
        try:
            result = await asyncio.wait_for(b.fetch(f"{pages.url}/seen?2"), 60)
            assert result.ok, result.error
            stats = b.stats()
            assert stats["browser/launches"] == 2 and stats["browser/restarts"] == 1
            assert frozen not in chromium_browsers() or len(
                set(chromium_browsers()) - before) == 2
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGCONT)
    await wait_for(lambda: not set(chromium_browsers()) - before, "the browsers to close")


# ---------------------------------------------------------------------- the command
def test_playwright_is_imported_only_when_a_page_is_rendered() -> None:
    code = ("import sys, crawlhub.cli, crawlhub.cli.crawl, crawlhub.app.crawl,"
            " crawlhub.agents.agent, crawlhub.agents.browser;"
            " print(sorted(m for m in sys.modules if m.startswith('playwright')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=_env(), timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_crawl_render_without_the_browser_fails_saying_how_to_install_it(
        tmp_path: Path) -> None:
    env = {**_env(), "CRAWLHUB_CHROMIUM": str(tmp_path / "no-chromium")}
    run = subprocess.run([sys.executable, "-m", "crawlhub", "crawl", "--render", "--quiet",
                          "--data-dir", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
                          "http://127.0.0.1:9/"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert run.returncode == 1, run.stderr
    assert f"no Chromium at {tmp_path / 'no-chromium'}" in run.stderr
    assert "apt-get install chromium" in run.stderr


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _items(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]

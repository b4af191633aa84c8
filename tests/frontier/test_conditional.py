"""Conditional recrawl: the frontier's archive keeps each URL's ETag, Last-Modified and
body hash (on a SQLite file and on real Redis, across restarts); ``crawlhub crawl
--recrawl`` sends them back, a 304 or an unchanged body is no item, a changed page is
written again and the links it gained are followed. The site is a real local server."""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from crawlhub.app.crawl import Crawl, CrawlOptions, CrawlProgress
from crawlhub.frontier import Frontier, open_store
from crawlhub.frontier.seed import Seed
from crawlhub.frontier.validators import (
    MAX_ETAG,
    Validators,
    clean_etag,
    clean_http_date,
    validators_of,
)
from tests.agents.servers import _Server, page_html
from tests.queues.conftest import delete_prefix

SINCE = email.utils.formatdate(1_700_000_000, usegmt=True)


class ChangingSite(_Server):
    """``pages`` pages linked as tests.agents.servers' site; ``change(n)`` edits page n.
    ``validators``: which it sends ("etag", "last-modified", "both", "none", or a raw
    ETag value to send as is). Counts 200 body bytes, 304s and conditional headers."""

    def __init__(self, pages: int, validators: str = "both") -> None:
        super().__init__()
        self.pages, self.validators = pages, validators
        self.version: Counter[int] = Counter()
        self.extra: dict[int, list[int]] = {}
        self.bytes = 0
        self.full = 0
        self.not_modified = 0
        self.asked: Counter[str] = Counter()
        #: seconds each page's answer waits (a slower site: a kill lands mid-recrawl)
        self.delay = 0.0
        #: ``/sitemap.xml`` lists every page with this ``<lastmod>`` (epoch s), or
        #: ``lastmod[n]`` for page n
        self.sitemap_lastmod = 1_600_000_000
        self.lastmod: dict[int, int] = {}
        self.app.router.add_get("/page/{n}", self.page)
        self.app.router.add_get("/sitemap.xml", self.sitemap)
        #: paths robots.txt disallows
        self.disallow: list[str] = []
        self.app.router.add_get("/robots.txt", self.robots)

    async def robots(self, request: web.Request) -> web.Response:
        rules = "".join(f"Disallow: {path}\n" for path in self.disallow)
        return web.Response(text=f"User-agent: *\n{rules}")

    async def sitemap(self, request: web.Request) -> web.Response:
        import datetime

        def w3c(when: int) -> str:
            return datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat()

        rows = "".join(f"<url><loc>{self.url}/page/{n}</loc><lastmod>"
                       f"{w3c(self.lastmod.get(n, self.sitemap_lastmod))}</lastmod></url>"
                       for n in range(self.pages))
        return web.Response(text='<?xml version="1.0" encoding="UTF-8"?><urlset xmlns='
                            f'"http://www.sitemaps.org/schemas/sitemap/0.9">{rows}</urlset>',
                            content_type="application/xml")

    def change(self, n: int, link_to: int | None = None) -> None:
        self.version[n] += 1
        if link_to is not None:
            self.extra.setdefault(n, []).append(link_to)

    def html(self, n: int) -> str:
        text = page_html(n, self.pages).replace(f"<title>Page {n}</title>",
                                                f"<title>Page {n} v{self.version[n]}</title>")
        more = "".join(f'<a href="/page/{m}">new</a>' for m in self.extra.get(n, []))
        return text.replace("</body>", more + "</body>")

    async def page(self, request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if self.delay:
            await asyncio.sleep(self.delay)
        body = self.html(n).encode()
        etag = '"' + hashlib.sha1(body).hexdigest()[:16] + '"'
        modified = email.utils.formatdate(1_700_000_000 + 1000 * self.version[n], usegmt=True)
        headers: dict[str, str] = {}
        if self.validators in ("etag", "both"):
            headers["ETag"] = etag
        if self.validators in ("last-modified", "both"):
            headers["Last-Modified"] = modified
        if self.validators not in ("etag", "both", "last-modified", "none"):
            headers["ETag"] = self.validators
        for name in ("If-None-Match", "If-Modified-Since"):
            if name in request.headers:
                self.asked[name] += 1
        if request.headers.get("If-None-Match") == etag and "ETag" in headers \
                or request.headers.get("If-Modified-Since") == modified \
                and "Last-Modified" in headers:
            self.not_modified += 1
            return web.Response(status=304, headers=headers)
        self.full += 1
        self.bytes += len(body)
        return web.Response(body=body, content_type="text/html", headers=headers)


@pytest.fixture
async def site() -> AsyncIterator[ChangingSite]:
    async with ChangingSite(pages=40) as s:
        yield s


async def crawl(site: ChangingSite, tmp_path: Path, **kw: Any) -> CrawlProgress:
    kw.setdefault("robots", False)
    opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=tmp_path / "items.jsonl",
                        data_dir=tmp_path / "data", follow=True, **kw)
    return await asyncio.wait_for(Crawl(opts).run(), 120)  # bounds a hung test only


def items(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]


async def test_a_recrawl_of_an_unchanged_site_downloads_nothing_and_writes_no_item(
        site: ChangingSite, tmp_path: Path) -> None:
    first = await crawl(site, tmp_path)
    assert first.pages == 40 and site.full == 40 and site.asked.total() == 0
    written = items(tmp_path)
    again = await crawl(site, tmp_path, recrawl=True)
    assert again.pages == 40 and again.unchanged == 40 and again.not_modified == 40
    assert site.full == 40 and site.not_modified == 40  # no page downloaded again
    assert site.asked["If-None-Match"] == 40 and site.asked["If-Modified-Since"] == 40
    assert items(tmp_path) == written and again.errors == 0


async def test_changed_pages_are_written_again_and_the_links_they_gained_are_followed(
        tmp_path: Path) -> None:
    async with ChangingSite(pages=40) as site:
        await crawl(site, tmp_path)
        site.pages = 41  # page 40 exists now, linked only from the changed page 7
        site.change(3)
        site.change(7, link_to=40)
        again = await crawl(site, tmp_path, recrawl=True)
    assert again.not_modified == 38 and again.pages == 41
    new = items(tmp_path)[40:]
    assert sorted(i["title"] for i in new) == ["Page 3 v1", "Page 40 v0", "Page 7 v1"]


async def test_each_recrawl_is_a_segment_of_its_own(site: ChangingSite,
                                                    tmp_path: Path) -> None:
    await crawl(site, tmp_path)
    await crawl(site, tmp_path, recrawl=True)
    site.change(5)
    third = await crawl(site, tmp_path, recrawl=True)
    assert third.pages == 40 and third.not_modified == 39
    assert json.loads((tmp_path / "data" / "recrawl.json").read_text())["segment"] == 2
    # a plain run on the data dir stays in the last segment: nothing to fetch
    plain = await crawl(site, tmp_path)
    assert plain.pages == 0


async def test_last_modified_alone_is_enough(tmp_path: Path) -> None:
    async with ChangingSite(pages=20, validators="last-modified") as site:
        await crawl(site, tmp_path)
        again = await crawl(site, tmp_path, recrawl=True)
        assert again.not_modified == 20 and site.full == 20
        assert site.asked == Counter({"If-Modified-Since": 20})


async def test_without_validators_an_unchanged_body_is_no_item_unless_asked_for(
        tmp_path: Path) -> None:
    async with ChangingSite(pages=20, validators="none") as site:
        await crawl(site, tmp_path)
        site.change(2)
        again = await crawl(site, tmp_path, recrawl=True)
        assert site.asked.total() == 0 and site.full == 40
        assert again.unchanged == 19 and again.not_modified == 0
        assert [i["title"] for i in items(tmp_path)[20:]] == ["Page 2 v1"]
        site.change(2)
        every = await crawl(site, tmp_path, recrawl=True, emit_unchanged=True)
        # every page extracted and handed to the sink again; this one writes changes only
        assert every.unchanged == 0 and every.pages == 20
        assert [i["title"] for i in items(tmp_path)[21:]] == ["Page 2 v2"]


async def test_the_archive_is_revalidated_without_a_queued_task_per_page(
        site: ChangingSite, tmp_path: Path) -> None:
    await crawl(site, tmp_path)
    pushed = await queue_total(tmp_path)
    site.change(3)
    site.change(9)
    again = await crawl(site, tmp_path, recrawl=True)
    assert (again.pages, again.unchanged, again.not_modified, again.errors) == (40, 38, 38, 0)
    assert sorted(i["title"] for i in items(tmp_path)[40:]) == ["Page 3 v1", "Page 9 v1"]
    assert site.full == 42 and site.not_modified == 38  # each URL asked once
    # the start URL is the one task queued: the archive's URLs went by the fast path
    assert await queue_total(tmp_path) - pushed == 1
    # and they are this segment's archive: the next recrawl knows all 40
    third = await crawl(site, tmp_path, recrawl=True)
    assert third.pages == 40 and third.not_modified == 40


async def queue_total(tmp_path: Path) -> int:
    """Messages ever pushed to the crawl's queue in ``tmp_path``'s data dir."""
    from crawlhub.app.crawl import QUEUE, crawl_config
    from crawlhub.services import Services

    opts = CrawlOptions(urls=[], out=tmp_path / "items.jsonl", data_dir=tmp_path / "data")
    services = await Services.open(crawl_config(opts))
    try:
        return (await services.queues.queue(QUEUE).stats()).total
    finally:
        await services.close()


async def test_a_sitemap_lastmod_not_after_the_last_fetch_means_the_page_is_not_fetched(
        tmp_path: Path) -> None:
    async with ChangingSite(pages=20) as site:
        first = await crawl(site, tmp_path, sitemaps_only=True)
        assert first.pages == 20 and site.full == 20
        site.change(3)
        site.lastmod[3] = int(time.time()) + 3600  # changed after its last fetch
        site.change(5)  # changed too, but its sitemap says not: the sitemap is believed
        again = await crawl(site, tmp_path, recrawl=True, sitemaps_only=True)
    assert again.pages == 20 and again.unchanged == 19 and again.not_modified == 0
    assert site.full == 21 and site.not_modified == 0  # page 3 alone was asked for
    assert [i["title"] for i in items(tmp_path)[20:]] == ["Page 3 v1"]


class Crash(BaseException):
    """Stands for a SIGKILL: no ``except Exception`` runs after it."""


async def test_a_recrawl_killed_after_a_batch_settled_resumes_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crawlhub.app import crawl as crawl_module

    monkeypatch.setattr(crawl_module, "RECRAWL_BATCH", 50)
    saved: list[str] = []
    save = crawl_module.Crawl._save_cursor

    def save_twice_then_die(self: Crawl, cursor: str) -> None:
        if len(saved) == 2:  # the third batch is settled whole: killed before its cursor
            raise Crash
        saved.append(cursor)
        save(self, cursor)

    async with ChangingSite(pages=200) as site:
        await crawl(site, tmp_path)
        changed = range(0, 200, 10)
        for n in changed:
            site.change(n)
        monkeypatch.setattr(crawl_module.Crawl, "_save_cursor", save_twice_then_die)
        with pytest.raises(Crash):
            await crawl(site, tmp_path, recrawl=True)
        monkeypatch.setattr(crawl_module.Crawl, "_save_cursor", save)
        asked = site.full + site.not_modified
        resumed = await crawl(site, tmp_path, recrawl=True)
        # the three settled batches are not asked again (the third is this segment's
        # already); the fourth, in flight at the kill, is; and the start URL, queued
        assert site.full + site.not_modified - asked == 51
        assert resumed.errors == 0
        new = [i["title"] for i in items(tmp_path)[200:]]
        assert sorted(new) == sorted(f"Page {n} v1" for n in changed)  # each once
        third = await crawl(site, tmp_path, recrawl=True)
    assert third.pages == 200 and third.not_modified == 200


async def test_a_recrawl_sigkilled_midway_resumes_and_writes_every_changed_page_once(
        tmp_path: Path) -> None:
    from tests.cli.serving import crawlhub_command
    from tests.helpers import wait_for

    async with ChangingSite(pages=300) as site:
        await crawl(site, tmp_path)
        changed = range(0, 300, 10)
        for n in changed:
            site.change(n)
        site.delay = 0.01
        before = site.full + site.not_modified
        argv = [*crawlhub_command(), "crawl", f"{site.url}/page/0", "--follow",
                "--no-robots", "--concurrency", "4", "--out", str(tmp_path / "items.jsonl"),
                "--data-dir", str(tmp_path / "data"), "--quiet", "--recrawl"]
        killed = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                      stderr=asyncio.subprocess.DEVNULL)
        try:
            await wait_for(lambda: site.full + site.not_modified - before >= 100,
                           "a third of the recrawl", timeout=60)
        finally:
            killed.kill()  # SIGKILL
            await killed.wait()
        assert site.full + site.not_modified - before < 300  # killed midway
        resumed = await asyncio.create_subprocess_exec(*argv,
                                                       stdout=asyncio.subprocess.DEVNULL,
                                                       stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(resumed.communicate(), 120)
        assert resumed.returncode == 0, err.decode()
        new = [i["title"] for i in items(tmp_path)[300:]]
        assert sorted(new) == sorted(f"Page {n} v1" for n in changed)  # none lost, none twice
        site.delay = 0.0
        third = await crawl(site, tmp_path, recrawl=True)
    assert third.pages == 300 and third.not_modified == 300 and third.errors == 0


async def test_a_recrawl_stopped_by_its_budget_or_its_control_is_finished_by_the_next_run(
        tmp_path: Path) -> None:
    from crawlhub import sdk

    async with ChangingSite(pages=60) as site:
        await crawl(site, tmp_path)
        changed = range(0, 60, 6)
        for n in changed:
            site.change(n)
        before = site.full + site.not_modified
        limited = await crawl(site, tmp_path, recrawl=True, max_pages=15)
        assert limited.limited and limited.pages == 15
        assert site.full + site.not_modified - before == 15
        exit_now = sdk.Manual("exit")  # exit asked before anything is fetched
        stopped = await crawl(site, tmp_path, recrawl=True, control=exit_now)
        assert stopped.exited and stopped.pages == 0
        assert site.full + site.not_modified - before == 15
        rest = await crawl(site, tmp_path, recrawl=True)
        # the 15 settled are not asked again: every URL asked once over the three runs
        assert not rest.exited and rest.pages == 45
        assert site.full + site.not_modified - before == 60
        new = [i["title"] for i in items(tmp_path)[60:]]
    assert sorted(new) == sorted(f"Page {n} v1" for n in changed)


async def test_a_recrawl_asks_robots_txt_and_keeps_to_the_domain_gate(
        site: ChangingSite, tmp_path: Path) -> None:
    site.disallow = ["/page/13"]
    await crawl(site, tmp_path)  # robots.txt not asked: page 13 is in the archive
    before = site.full + site.not_modified
    again = await crawl(site, tmp_path, recrawl=True, robots=True, per_domain=4)
    assert again.robots == 1 and again.not_modified == 39 and again.errors == 0
    assert site.full + site.not_modified - before == 39  # page 13 not asked for


async def test_a_malformed_etag_is_never_sent_back(tmp_path: Path) -> None:
    # non-ASCII and a tab (control characters in a header: the unit test below)
    async with ChangingSite(pages=10, validators='"caf\u00e9\tb"') as site:
        await crawl(site, tmp_path)
        again = await crawl(site, tmp_path, recrawl=True)
        assert site.asked["If-None-Match"] == 0 and again.errors == 0
        assert again.unchanged == 10  # told by the body's hash instead


def test_hostile_validators_are_cleaned() -> None:
    assert clean_etag('W/"abc"') == 'W/"abc"'
    for bad in ("", "\r\nX-Injected: 1", '"a\nb"', "é", "x" * 1000, '"' + "x" * MAX_ETAG + '"',
                None):
        assert clean_etag(bad) is None
    assert clean_http_date("Tue, 14 Nov 2023 22:13:20 GMT") == SINCE
    assert clean_http_date("Tue, 14 Nov 2023 23:13:20 +0100") == SINCE  # sent back in GMT
    for bad in ("yesterday", "Tue, 14 Nov 2023 22:13:20", "Fri, 31 Dec 99999 23:59:59 GMT",
                "9" * 100, "\x00", None):
        assert clean_http_date(bad) is None
    v = validators_of({"ETag": "\x00bad", "Last-Modified": "soon"}, b"body", 1.0)
    assert v.headers() == {} and v.hash is not None


@pytest.fixture(params=["sqlite", "redis"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path,
                    unique_name: str) -> AsyncIterator[tuple[str, str]]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/frontier.db", ""
        return
    url = request.getfixturevalue("redis_url")
    yield url, f"test:{unique_name}:"
    await delete_prefix(url, f"test:{unique_name}:")


async def test_validators_and_the_archive_survive_a_restart(
        store_url: tuple[str, str], tmp_path: Path) -> None:
    url, prefix = store_url

    def frontier() -> Frontier:
        return Frontier("pages", open_store(url, "pages", prefix=prefix,
                                            expected_items=10_000, fp_rate=0.001))

    kept = {f"k{i}": Validators(f'"e{i}"', SINCE if i % 2 else None, f"h{i}", 5.0)
            for i in range(2500)}
    f = frontier()
    async with f:
        await f.admit([Seed(f"http://a.test/p{i}") for i in range(2500)])
        segment = f.current_segment()
        await f.store.remember(list(kept.items()))
        await f.store.remember([("k1", Validators('"new"', None, "h", 6.0))])
    again = frontier()
    async with again:
        found = await again.store.validators([*kept, "unknown"])
        assert found == {**kept, "k1": Validators('"new"', None, "h", 6.0)}
        urls: list[str] = []
        cursor = ""
        while True:
            cursor, seeds = await again.store.archived(segment, cursor, 1000)
            urls += [s.url for s in seeds]
            if not cursor:
                break
        assert sorted(urls) == sorted(f"http://a.test/p{i}" for i in range(2500))
        # which keys a segment admitted, from the stored keys (a past segment's filter
        # is gone after a snapshot): what a recrawl asks of a link
        key = again.keys.key(Seed("http://a.test/p7"))
        assert await again.store.stored(segment, [key, "http://a.test/nowhere"]) == {key}
        assert await again.store.stored(segment + 1, [key]) == set()
        await again.store.purge()
        assert await again.store.validators(list(kept)) == {}


class DemoShop(_Server):
    """``crawlhub demo``'s shop, served in the test's loop."""

    def __init__(self) -> None:
        super().__init__()
        from crawlhub.demo.site import add_routes

        add_routes(self.app)


async def test_the_demo_shop_answers_304_to_its_own_etag() -> None:
    import aiohttp

    async with DemoShop() as shop, aiohttp.ClientSession() as http:
        async with http.get(f"{shop.url}/item/3") as first:
            etag = first.headers["ETag"]
            assert first.status == 200 and first.headers["Last-Modified"]
        async with http.get(f"{shop.url}/item/3", headers={"If-None-Match": etag}) as again:
            assert again.status == 304 and await again.read() == b""
        async with http.get(f"{shop.url}/item/4", headers={"If-None-Match": etag}) as other:
            assert other.status == 200  # another page's tag is no match
        async with http.get(f"{shop.url}/robots.txt", headers={"If-None-Match": etag}) as txt:
            assert txt.status == 200 and "ETag" not in txt.headers  # HTML pages only


# ------------------------------------------------------------ crawlhub agent --revalidate
async def test_a_fleet_agent_revalidates_the_urls_a_later_segment_hands_it(
        site: ChangingSite, tmp_path: Path) -> None:
    # `crawlhub agent --revalidate f`, a real process leasing from the hub's queue: the
    # first segment's pages are fetched whole and their validators kept in frontier f's
    # archive; the same URLs submitted in the next segment are admitted again and asked
    # conditionally - a 304 writes no item, the one page changed is written again.
    import os
    import signal
    import sys

    import yaml

    from crawlhub.config import load_config
    from crawlhub.services import Services

    config = tmp_path / "hub.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "frontier": {"f": {"segment": "2s"}},
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": "pages", "frontier": "f", "init": {"key": "pages"}}]}))
    out = tmp_path / "items.jsonl"  # (read by items())
    urls = [f"{site.url}/page/{n}" for n in range(40)]

    async def submit() -> list[str]:
        services = await Services.open(load_config(config))
        try:
            return [r.status for r in await services.hub.submit([{"url": u} for u in urls])]
        finally:
            await services.close()

    async def agent_until(answers: int, written: int) -> None:
        """Run an agent until the site gave ``answers`` answers and the sink holds
        ``written`` items (it may write more by its end: the counts are checked after)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crawlhub", "agent", "-c", str(config), "--revalidate", "f",
            "--no-robots", "--sink", yaml.safe_dump({"type": "jsonl", "path": str(out),
                                                   "key": ["url"]}),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + 90  # bounds a hung test only
            while site.full + site.not_modified < answers or (
                    out.read_bytes().count(b"\n") if out.exists() else 0) < written:
                assert proc.returncode is None, await proc.stderr.read()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the agent did not fetch every page"
                await asyncio.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)

    assert await submit() == ["routed"] * 40
    await agent_until(40, 40)
    assert site.full == 40 and site.asked.total() == 0  # nothing kept yet: asked plainly
    assert len(items(tmp_path)) == 40
    # the next segment (2 s long): the same URLs are admitted again
    segment_end = (time.time() // 2 + 1) * 2
    await asyncio.sleep(max(0.0, segment_end - time.time()) + 0.1)
    site.change(3)
    assert await submit() == ["routed"] * 40
    await agent_until(80, 41)
    assert site.asked["If-None-Match"] == 40 and site.asked["If-Modified-Since"] == 40
    assert site.not_modified == 39 and site.full == 41
    written = items(tmp_path)
    assert len(written) == 41 and written[-1]["title"] == "Page 3 v1"


def test_revalidating_into_a_frontier_the_config_lacks_is_refused_naming_the_key(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    config = tmp_path / "hub.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": "pages", "init": {"key": "pages"}}]}))
    done = subprocess.run([sys.executable, "-m", "crawlhub", "agent", "-c", str(config),
                           "--revalidate", "nosuch"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "agent.revalidate" in done.stderr and "'nosuch'" in done.stderr

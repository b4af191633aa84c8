"""The one-process crawl (``crawlhub crawl``) on real local sites: every page once, each
item once, resume after SIGKILL without fetching again what was written."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from crawlhub.app.crawl import Crawl, CrawlOptions
from tests.agents.servers import Site
from tests.helpers import wait_for

CRAWLHUB = str(Path(sys.executable).parent / "crawlhub")


def rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class SlowSite(Site):
    """The test site with every page answering after ``delay`` seconds."""

    def __init__(self, pages: int, delay: float) -> None:
        super().__init__(pages=pages)
        self.delay = delay
        self.app.middlewares.insert(0, self._slow)

    @web.middleware
    async def _slow(self, request: web.Request, handler: Any) -> web.StreamResponse:
        await asyncio.sleep(self.delay)
        return await handler(request)  # type: ignore[no-any-return]


async def test_crawl_fetches_every_page_of_a_link_graph_once_and_writes_each_item_once(
        tmp_path: Path) -> None:
    async with Site(pages=150) as site:
        out = tmp_path / "items.jsonl"
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=tmp_path / "data",
                            follow=True, concurrency=8)
        progress = await Crawl(opts).run()
        pages = {f"/page/{n}" for n in range(150)}
        assert {p: site.hits[p] for p in pages} == dict.fromkeys(pages, 1)
        items = rows(out)
        assert len(items) == 150
        assert {i["url"] for i in items} == {f"{site.url}{p}" for p in pages}
        first = next(i for i in items if i["url"].endswith("/page/7"))
        assert first["status"] == 200 and first["title"] == "Page 7"
        assert progress.pages == 150 and progress.items == 150 and progress.errors == 0


async def test_crawl_writes_extracted_fields_and_keeps_to_allow_and_depth(
        tmp_path: Path) -> None:
    async with Site(pages=200) as site:
        out = tmp_path / "items.jsonl"
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=tmp_path / "data",
                            follow=True, depth=1, deny=[r"/page/1\d*$"],
                            extract={"fields": {"heading": {"css": "h1::text"}}})
        await Crawl(opts).run()
        items = {i["url"].rsplit("/", 1)[1]: i for i in rows(out)}
        # page 0 links to 1..10; /page/1 and /page/10 are denied; depth 1 stops there
        assert sorted(items, key=int) == ["0", "2", "3", "4", "5", "6", "7", "8", "9"]
        assert items["3"]["heading"] == "Page 3"
        assert site.hits["/page/11"] == 0


async def test_crawl_resumed_after_sigkill_fetches_nothing_twice_that_was_written(
        tmp_path: Path) -> None:
    out, data = tmp_path / "items.jsonl", tmp_path / "data"
    async with SlowSite(pages=400, delay=0.02) as site:
        argv = [CRAWLHUB, "crawl", f"{site.url}/page/0", "--follow", "--concurrency", "4",
                "--out", str(out), "--data-dir", str(data), "--quiet"]
        first = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
        index_path = out.with_name(out.name + ".index.sqlite")

        def written() -> set[str]:
            # the index commits after the lines are written, in batches: it is the record
            # of what the sink holds for sure, so the kill waits on it, not on the lines
            if not index_path.exists():
                return set()
            index = sqlite3.connect(index_path, timeout=0.2)
            try:
                return {key for (key,) in index.execute("SELECT key FROM keyed")}
            except sqlite3.OperationalError:  # not created yet, or locked by the writer
                return set()
            finally:
                index.close()

        await wait_for(lambda: len(written()) >= 60, "60 items in the index", timeout=60)
        os.kill(first.pid, signal.SIGKILL)
        await first.wait()
        done = written()
        assert 60 <= len(done) < 400
        hits_at_kill = sum(site.hits.values())
        second = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(second.communicate(), timeout=120)
        assert second.returncode == 0, err.decode()
        pages = {f"/page/{n}" for n in range(400)}
        assert all(site.hits[p] >= 1 for p in pages)
        twice = {p for p in pages if site.hits[p] > 1}
        assert not twice & {u.removeprefix(site.url) for u in done}
        assert sum(site.hits.values()) > hits_at_kill
        items = rows(out)
        assert len(items) == 400 == len({i["url"] for i in items})


def test_seen_links_pass_once_and_memory_stays_bounded() -> None:
    from crawlhub.app.crawl import Seen

    seen = Seen(size=3)
    assert seen.fresh({"a": 1, "b": 1}) == {"a": 1, "b": 1}
    assert seen.fresh({"a": 1}) == {"a": 1}  # not submitted yet: still fresh
    seen.add(["a", "b"])
    assert seen.fresh({"a": 2, "c": 2}) == {"c": 2}
    for n in range(100):
        seen.add([f"u{n}"])
    assert len(seen.new) + len(seen.old) <= 6
    assert seen.fresh({"a": 3}) == {"a": 3}  # forgotten: the frontier dedups it


async def test_links_of_a_submit_that_failed_are_submitted_again() -> None:
    from crawlhub.app.crawl import Seen

    class Hub:
        def __init__(self) -> None:
            self.down, self.got = True, []  # type: ignore[var-annotated]

        async def submit(self, tasks: Any, wait: bool) -> None:
            if self.down:
                raise ConnectionError("the hub's backend is down")
            self.got += [t["url"] for t in tasks]

    seen, hub = Seen(), Hub()
    try:
        await seen.submit(hub, {"http://a/1": 1}, [])
    except ConnectionError:
        pass
    hub.down = False  # the page is fetched again after its lease: its links go again
    assert await seen.submit(hub, {"http://a/1": 1}, []) == 1
    assert hub.got == ["http://a/1"]
    assert await seen.submit(hub, {"http://a/1": 1}, []) == 0


async def test_a_second_crawl_on_a_data_dir_in_use_is_refused_naming_it(tmp_path: Path) -> None:
    import pytest

    from crawlhub.app.crawl import _lock
    from crawlhub.core.errors import CrawlhubError

    data = tmp_path / "data"
    data.mkdir()
    held = _lock(data)
    try:
        opts = CrawlOptions(urls=["http://127.0.0.1:1/"], out=tmp_path / "i.jsonl",
                            data_dir=data)
        with pytest.raises(CrawlhubError, match="another crawl is running on the data dir"):
            await Crawl(opts).run()
    finally:
        held.close()


async def test_crawl_with_per_domain_limit_never_has_more_requests_in_flight_on_the_site(
        tmp_path: Path) -> None:
    async with SlowSite(pages=40, delay=0.01) as site:
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=tmp_path / "items.jsonl",
                            data_dir=tmp_path / "data", follow=True, concurrency=16,
                            per_domain=2)
        progress = await Crawl(opts).run()
        assert progress.pages == 40
        assert site.peak <= 2


async def test_crawl_writes_to_the_sink_given_with_sink_instead_of_out(
        tmp_path: Path, redis_url: str, unique_name: str) -> None:
    import redis.asyncio as aioredis
    import yaml

    stream = f"{unique_name}:items"
    sink = yaml.safe_dump({"type": "redis_stream", "url": redis_url, "stream": stream},
                          default_flow_style=True).strip()
    client = aioredis.from_url(redis_url)
    try:
        async with Site(pages=30) as site:
            proc = await asyncio.create_subprocess_exec(
                CRAWLHUB, "crawl", f"{site.url}/page/0", "--follow", "--concurrency", "4",
                "--sink", sink, "--data-dir", str(tmp_path / "data"), "--quiet",
                "--out", str(tmp_path / "unused.jsonl"), stderr=asyncio.subprocess.PIPE)
            _, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
            assert proc.returncode == 0, stderr.decode()
            assert "30 items to the redis_stream sink" in stderr.decode()
        entries = await client.xrange(stream)
        urls = [json.loads(fields[b"data"])["url"] for _, fields in entries]
        assert sorted(urls) == sorted(f"{site.url}/page/{n}" for n in range(30))
        assert not (tmp_path / "unused.jsonl").exists()
    finally:
        await client.delete(stream)
        await client.aclose()


async def test_a_bad_sink_is_a_clear_error_before_anything_is_fetched(tmp_path: Path) -> None:
    async with Site(pages=3) as site:
        proc = await asyncio.create_subprocess_exec(
            CRAWLHUB, "crawl", f"{site.url}/page/0", "--sink", "{type: nosuchsink}",
            "--data-dir", str(tmp_path / "data"), "--quiet", stderr=asyncio.subprocess.PIPE)
        _, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode != 0
        assert "nosuchsink" in stderr.decode() and "Traceback" not in stderr.decode()
        assert not site.hits

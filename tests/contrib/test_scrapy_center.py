"""Scrapy's downloads through the download center: a real ``scrapy runspider`` process,
a local site, a center and two agents on real Redis. Chained: every page fetched once,
every follow-up request served by its parent's agent, both agents busy (on the asyncio
reactor and on a plain one). Too few agents: the allocation is refused, the spider
closes and fetches nothing. A download unanswered past its retries closes the spider.
No broker setting: the error names it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crawlhub.center import CenterWorker, DownloadCenter, open_bus
from tests.agents.servers import Site
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SPIDER = Path(__file__).with_name("center_spider.py")
HANDLER = "crawlhub.contrib.scrapy.center.CenterDownloadHandler"
MIDDLEWARE = "crawlhub.contrib.scrapy.center.CenterSpiderMiddleware"
PAGES = 60
#: Unbound (start) requests are the only ones the center places at random: with this
#: seed its first two choices differ, so two start pages go to two agents. (A start page
#: may be found as a link before its own start request is scheduled, then that start
#: request is a duplicate: at least the first two are always scheduled first.)
SEED = 7


class Center:
    """A center and agents on a fresh Redis prefix, run in the test's loop."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"t{uuid.uuid4().hex[:8]}:"
        self.center = DownloadCenter(open_bus(url, prefix=self.prefix), center_id="c1",
                                     check_every=0.2, rng=random.Random(SEED))
        self.agents: dict[str, CenterWorker] = {}
        self._runs: list[tuple[asyncio.Task[None], asyncio.Event, Any]] = []
        self._run(self.center)

    def _run(self, thing: Any) -> None:
        stop = asyncio.Event()
        self._runs.append((asyncio.create_task(thing.run(stop)), stop, thing.bus))

    async def start_agents(self, *names: str) -> None:
        """Agents ``names``, once the center sees every one live."""
        for name in names:
            worker = CenterWorker(open_bus(self.url, prefix=self.prefix), name,
                                  beat_every=0.2)
            self.agents[name] = worker
            self._run(worker)
        await wait_for(lambda: len(self.center.live_agents()) >= len(self.agents),
                       f"{len(self.agents)} live agents", timeout=10)

    async def close(self) -> None:
        for task, stop, _ in self._runs:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
        for _, _, bus in self._runs:
            await bus.close()


@pytest.fixture
async def center(redis_url: str) -> AsyncIterator[Center]:
    running = Center(redis_url)
    try:
        yield running
    finally:
        await running.close()


async def run_spider(tmp_path: Path, start: list[str], **settings: Any
                     ) -> tuple[int, str, list[dict[str, Any]]]:
    """One ``scrapy runspider`` of the center spider: its exit code, log and rows."""
    items, log = tmp_path / "items.jsonl", tmp_path / "spider.log"
    every = {
        "DOWNLOAD_HANDLERS": json.dumps({"http": HANDLER, "https": HANDLER}),
        "SPIDER_MIDDLEWARES": json.dumps({MIDDLEWARE: 50}),
        "CONCURRENT_REQUESTS": "8",
        "ROBOTSTXT_OBEY": "False",
        "TELNETCONSOLE_ENABLED": "False",
        "LOG_LEVEL": "INFO",
        **settings,
    }
    args = [sys.executable, "-m", "scrapy", "runspider", str(SPIDER)]
    for k, v in every.items():
        args += ["-s", f"{k}={v}"]
    with open(log, "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=str(ROOT), stdout=asyncio.subprocess.DEVNULL, stderr=err,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
                 "ITEMS": str(items),
                 "START": " ".join(start)})
        try:
            code = await asyncio.wait_for(proc.wait(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    rows = ([json.loads(line) for line in items.read_text().splitlines() if line]
            if items.exists() else [])
    return code, log.read_text(errors="replace"), rows


def center_settings(center: Center, **over: Any) -> dict[str, Any]:
    return {"CRAWLHUB_CENTER_URL": center.url, "CRAWLHUB_CENTER_PREFIX": center.prefix,
            "CRAWLHUB_CENTER_STRATEGY": "chained", "CRAWLHUB_CENTER_AGENTS": "2",
            "CRAWLHUB_CENTER_ALLOCATE_TIMEOUT": "5", **over}


def stat(log: str, name: str) -> Any:
    found = re.search(rf"'{re.escape(name)}': ([^,\n}}]+)", log)
    return None if found is None else found.group(1).strip("'")


@pytest.mark.parametrize("reactor", [
    "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
    "twisted.internet.selectreactor.SelectReactor",
])
async def test_a_chained_crawl_fetches_every_page_once_on_its_parents_agent(
        tmp_path: Path, center: Center, reactor: str) -> None:
    async with Site(pages=PAGES) as site:
        await center.start_agents("a0", "a1")
        start = [f"{site.url}/page/{n}" for n in range(8)]
        code, log, rows = await run_spider(
            tmp_path, start, TWISTED_REACTOR=reactor,
            **center_settings(center, CRAWLHUB_CENTER_JOB=f"job-{uuid.uuid4().hex[:8]}"))
        assert code == 0, log[-3000:]
        every = {f"/page/{n}" for n in range(PAGES)}
        assert dict(site.hits) == dict.fromkeys(every, 1), log[-3000:]
    assert stat(log, "finish_reason") == "finished", log[-3000:]
    assert {r["reactor"] for r in rows} == {reactor}

    # every page scraped once, each by an allocated agent
    assert Counter(r["url"].split("/", 3)[3] for r in rows) == Counter(
        p.lstrip("/") for p in every)
    assert stat(log, "item_scraped_count") == str(PAGES)
    assert all(r["status"] == 200 and r["title"] for r in rows)
    by_agent = Counter(r["agent"] for r in rows)
    assert set(by_agent) == {"a0", "a1"}, by_agent
    assert {a: w.pages for a, w in center.agents.items()} == dict(by_agent)

    # chained: a follow-up went to the agent of the page it was found on
    starts = [r for r in rows if r["parent"] is None]
    assert len(starts) >= 2 and {r["url"] for r in starts} <= set(start), starts
    follow_ups = [r for r in rows if r["parent"] is not None]
    assert len(follow_ups) == PAGES - len(starts)
    assert [r for r in follow_ups if r["agent"] != r["parent"]] == []

    # the allocation was released when the spider closed
    assert stat(log, "crawlhub_center/reply/ok") == str(PAGES)
    await wait_for(lambda: all(not w.jobs for w in center.agents.values()),
                   "the agents released the job", timeout=10)


async def test_too_few_agents_refuse_the_allocation_and_nothing_is_fetched(
        tmp_path: Path, center: Center) -> None:
    async with Site(pages=PAGES) as site:
        await center.start_agents("a0", "a1")
        code, log, rows = await run_spider(
            tmp_path, [f"{site.url}/page/0"],
            **center_settings(center, CRAWLHUB_CENTER_AGENTS="5"))
        assert not site.hits
    assert code == 0, log[-3000:]
    assert "asked for 5 agents (chained), 2 live" in log, log[-3000:]
    assert "crawlhub_center_allocation_failed" in log
    assert stat(log, "finish_reason") == "crawlhub_center_allocation_failed"
    assert not rows
    assert all(w.pages == 0 and not w.jobs for w in center.agents.values())


async def test_a_download_left_unanswered_closes_the_spider(
        tmp_path: Path, center: Center) -> None:
    async with Site(pages=PAGES) as site:
        await center.start_agents("a0")
        try:
            code, log, rows = await run_spider(
                tmp_path, [f"{site.url}/held"],
                **center_settings(center, CRAWLHUB_CENTER_STRATEGY="fixed",
                                  CRAWLHUB_CENTER_AGENTS="1",
                                  CRAWLHUB_CENTER_TIMEOUT="1",
                                  CRAWLHUB_CENTER_RETRIES="0"))
        finally:
            site.release.set()
    assert code == 0, log[-3000:]
    assert stat(log, "finish_reason") == "crawlhub_center_error", log[-3000:]
    assert "unanswered after 1 sends" in log and "Error downloading" in log
    assert not rows


async def test_a_missing_center_url_is_named(tmp_path: Path) -> None:
    async with Site(pages=2) as site:
        code, log, rows = await run_spider(tmp_path, [f"{site.url}/page/0"])
        assert not site.hits
    assert "Scrapy setting CRAWLHUB_CENTER_URL: not set" in log, log[-3000:]
    assert not rows

"""A resumed crawl takes over at once what the killed run left half done and finishes by
itself: links recorded and not pushed, a retry settled and not pushed, a robots.txt fetch
claimed and never written. Each kill is staged at its exact point (a ``Crash`` stands for
the SIGKILL: no ``except Exception`` runs after it); ``tests/chaos/test_crawl_chaos.py``
SIGKILLs real crawls at random points."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from crawlhub.agents.politeness import open_gate_store
from crawlhub.app.crawl import QUEUE, Crawl, CrawlOptions, crawl_config
from crawlhub.services import Services
from tests.agents.servers import Site

#: Seconds a resumed crawl of a few dozen local pages gets before it counts as hung.
HUNG = 60


class Crash(BaseException):
    """Stands for a SIGKILL: no ``except Exception`` of the hub runs after it."""


async def die(*args: Any, **kwargs: Any) -> Any:
    raise Crash


def urls_in(out: Path) -> list[str]:
    return [json.loads(line)["url"] for line in out.read_text().splitlines() if line.strip()]


def options(site: Site, tmp_path: Path, start: str = "/page/0") -> CrawlOptions:
    opts = CrawlOptions(urls=[f"{site.url}{start}"], out=tmp_path / "items.jsonl",
                        data_dir=tmp_path / "data", follow=True, concurrency=8)
    opts.data_dir.mkdir(parents=True)
    return opts


async def test_a_start_url_recorded_and_not_pushed_by_a_killed_crawl_is_crawled_on_resume(
        tmp_path: Path) -> None:
    async with Site(pages=40) as site:
        opts = options(site, tmp_path)
        killed = await Services.open(crawl_config(opts))
        try:
            # killed after the frontier admitted the start URL, before its push: the
            # ledger holds it unpushed, owned by a process that beat a moment ago
            killed.hub._push_recorded = die  # type: ignore[method-assign]
            with pytest.raises(Crash):
                await killed.hub.submit([{"url": opts.urls[0], "depth": 0}], wait=True)
        finally:
            await killed.close()
        # the start URL is submitted again (a duplicate now): the killed run's record is
        # the only way to it
        progress = await asyncio.wait_for(Crawl(opts).run(), HUNG)
        urls = urls_in(opts.out)
        assert sorted(urls) == sorted(f"{site.url}/page/{n}" for n in range(40))
        assert progress.pages == 40


async def test_a_retry_settled_and_not_pushed_by_a_killed_crawl_is_fetched_on_resume(
        tmp_path: Path) -> None:
    async with Site(pages=1) as site:
        opts = options(site, tmp_path, "/status/500")
        killed = await Services.open(crawl_config(opts))
        try:
            await killed.hub.submit([{"url": opts.urls[0], "depth": 0}], wait=True)
            queue = killed.queues.queue(QUEUE)
            [message] = await queue.lease(1, 60)
            # its first fetch answered 500: the result settles a retry, kept leased until
            # it is pushed; killed before the push, after the ack (the agent's order)
            killed.hub._finish = die  # type: ignore[method-assign]
            result = {"task_uuid": message.payload["task_uuid"], "task_result": 500,
                      "routed_count": message.payload["routed_count"]}
            with pytest.raises(Crash):
                await killed.hub.receive("http", [result])
            await queue.ack([message.id])
        finally:
            await killed.close()
        progress = await asyncio.wait_for(Crawl(opts).run(), HUNG)
        # the two tries left (retries: 2) are made, then the task fails
        assert site.hits["/status/500"] == 2
        assert progress.pages == 2 and progress.errors == 2


async def test_a_robots_fetch_claimed_by_a_killed_crawl_is_not_waited_out_on_resume(
        tmp_path: Path) -> None:
    async with Site(pages=20) as site:
        opts = options(site, tmp_path)
        store = open_gate_store(f"sqlite:///{opts.data_dir / 'politeness.db'}")
        try:
            # killed while fetching the site's robots.txt: its claim outlives it (for an
            # hour here; 30 s in life)
            now = time.time()
            assert await store.robots_claim(site.url, now, now + 3600)
        finally:
            await store.close()
        progress = await asyncio.wait_for(Crawl(opts).run(), HUNG)
        assert progress.pages == 20 and site.hits["/robots.txt"] == 1

"""The agent extends the leases of the tasks it holds (buffered, in flight, waiting for
their flush), in one ``extend`` per queue a round, so a site slower than the lease never
sees a page twice."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crawlhub.agents.agent import Agent, HubReport
from crawlhub.agents.downloader import Downloader
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.queues.sqlite import SqliteQueueBackend
from crawlhub.services import Services
from tests.agents.servers import Site
from tests.agents.test_crawl import SlowSite
from tests.helpers import FakeClock, wait_for
from tests.queues.conftest import delete_prefix


class CountedExtends:
    """A real queue whose ``extend`` calls are recorded (everything else passes through)."""

    def __init__(self, queue: Any, calls: list[tuple[str, list[str]]]) -> None:
        self.queue, self.calls = queue, calls

    async def extend(self, ids: Sequence[str], visibility_timeout: float) -> int:
        self.calls.append((self.queue.name, list(ids)))
        return int(await self.queue.extend(ids, visibility_timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)


async def test_two_agents_with_a_lease_shorter_than_each_page_fetch_every_page_once(
        tmp_path: Path, redis_url: str) -> None:
    prefix = f"t-lease-{uuid.uuid4().hex[:8]}:"
    cfg = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path),
        "storage": {"queues": redis_url, "state": redis_url, "redis_prefix": prefix},
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": "pages", "class": "queue", "init": {"key": "pages"}}],
    })
    # each page takes longer than a lease; each agent buffers a second round behind it
    async with SlowSite(pages=8, delay=2.5) as site:
        services = await Services.open(cfg)
        downloaders = [Downloader(), Downloader()]
        try:
            await services.hub.submit([{"url": f"{site.url}/page/{n}"} for n in range(8)])
            queue = services.queues.queue("pages")
            agents = [Agent({"pages": queue}, d, report=HubReport(services.hub, "http"),
                            concurrency=2, lease_batch=4, lease_seconds=2.0)
                      for d in downloaders]

            async def idle() -> bool:
                return not await queue.length() and not await services.state.pending()

            await asyncio.wait_for(
                asyncio.gather(*(a.run(until_idle=idle) for a in agents)), timeout=120)
            assert {f"/page/{n}": site.hits[f"/page/{n}"] for n in range(8)} == {
                f"/page/{n}": 1 for n in range(8)}
            assert sum(a.stats.pages for a in agents) == 8
            stats = await queue.stats()
            assert stats.success == 8 and stats.retried == 0
        finally:
            for d in downloaders:
                await d.close()
            await services.close()
            await delete_prefix(redis_url, prefix)


async def test_renew_extends_every_held_lease_in_one_call_per_queue(
        tmp_path: Path, clock: FakeClock) -> None:
    backend = SqliteQueueBackend(f"sqlite:///{tmp_path}/queues.db", clock=clock)
    calls: list[tuple[str, list[str]]] = []
    queues = {name: CountedExtends(backend.queue(name), calls) for name in ("a", "b")}
    results: list[dict[str, Any]] = []

    async def report(batch: list[dict[str, Any]]) -> None:
        results.extend(batch)

    async with Site() as site:
        for name in queues:  # two tasks a queue, each held at the site until released
            await backend.queue(name).push_many([({"url": f"{site.url}/held?{name}{k}"}, 0)
                                                 for k in range(2)])
        downloader = Downloader()
        # lease 600 s: the agent's own rounds (every 200 s of real time) never come
        agent = Agent(queues, downloader, report=report,  # type: ignore[arg-type]
                      concurrency=4, lease_batch=2, lease_seconds=600, clock=clock)
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        try:
            await wait_for(lambda: site.held == 4, "all four tasks in flight")
            clock.advance(150)  # under a third of a lease: nothing is due yet
            assert await agent.renew() == 0 and calls == []
            clock.advance(100)
            assert await agent.renew() == 4
            assert sorted((name, len(ids)) for name, ids in calls) == [("a", 2), ("b", 2)]
            assert await agent.renew() == 0  # just extended: not due again
            clock.advance(500)  # past the first leases' end, inside the extended ones
            for name in queues:
                assert await backend.queue(name).lease(10, 600) == []
            site.release.set()
            await wait_for(lambda: len(results) == 4, "four results reported")
            await wait_for(lambda: not agent._held, "the acked tasks no longer held")
            for name in queues:
                assert (await backend.queue(name).stats()).success == 2
        finally:
            stop.set()
            site.release.set()
            await running
            await downloader.close()
            await backend.close()

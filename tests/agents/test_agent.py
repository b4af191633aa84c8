"""The agent against a real hub, queue and local site: result codes from the table, the
hub's retry / dont_retry rules applied to them, acks only after the report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from crawlhub.agents.agent import Agent, HubReport
from crawlhub.agents.codes import ResultCodes
from crawlhub.agents.downloader import Downloader, DownloaderConfig
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.services import Services
from tests.agents.servers import Site


def config(data_dir: Path, **outbound: Any) -> CrawlhubConfig:
    return CrawlhubConfig.model_validate({
        "data_dir": str(data_dir),
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": "pages", "class": "queue", "init": {"key": "pages"},
                      **outbound}],
    })


async def run_until_idle(services: Services, agent: Agent) -> None:
    queue = services.queues.queue("pages")

    async def idle() -> bool:
        return not await queue.length() and not await services.state.pending()

    await asyncio.wait_for(agent.run(until_idle=idle), timeout=60)


def failures(services: Services) -> dict[str, Any]:
    path = Path(services.hub.failures.path)
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return {line["task"]["url"].rsplit("/", 2)[-2] + "/" + line["task"]["url"].rsplit("/", 1)[1]
            if "/status/" in line["task"]["url"] else "slow": line for line in lines}


async def test_agent_reports_404_500_and_timeout_with_the_table_codes_and_the_hub_retries_by_its_rules(
        tmp_path: Path) -> None:
    async with Site() as site:
        services = await Services.open(config(tmp_path, retry_limits=2,
                                              dont_retry_status=[404]))
        try:
            await services.hub.submit([{"url": f"{site.url}/status/404"},
                                       {"url": f"{site.url}/status/500"},
                                       {"url": f"{site.url}/slow"},
                                       {"url": f"{site.url}/page/1"}])
            downloader = Downloader(DownloaderConfig(timeout=0.3))
            agent = Agent({"pages": services.queues.queue("pages")}, downloader,
                          report=HubReport(services.hub, "http"), codes=ResultCodes(),
                          concurrency=4)
            try:
                await run_until_idle(services, agent)
            finally:
                await downloader.close()
            # 404 is in dont_retry_status: once; 500 and the timeout: 1 + 2 retries
            assert site.hits["/status/404"] == 1
            assert site.hits["/status/500"] == 3
            assert site.hits["/slow"] == 3
            assert site.hits["/page/1"] == 1
            failed = failures(services)
            assert failed["status/404"]["task_result"] == 404
            assert failed["status/500"]["task_result"] == 500
            assert failed["slow"]["task_result"] == 2001  # the table's timeout code
            assert agent.stats.by_code == {1000: 1, 404: 1, 500: 3, 2001: 3}
            counters = (await services.state.counters())["pages"]
            assert counters["success"] == 1 and counters["failed"] == 3
            stats = await services.queues.queue("pages").stats()
            assert stats.left == 0 and stats.success == 8  # every delivery acked
        finally:
            await services.close()


async def test_a_mapped_status_is_reported_with_its_configured_code(tmp_path: Path) -> None:
    async with Site() as site:
        services = await Services.open(config(tmp_path, retry_limits=0))
        try:
            await services.hub.submit([{"url": f"{site.url}/status/404"}])
            downloader = Downloader()
            agent = Agent({"pages": services.queues.queue("pages")}, downloader,
                          report=HubReport(services.hub, "http"),
                          codes=ResultCodes(statuses={404: 1000}), concurrency=1)
            try:
                await run_until_idle(services, agent)
            finally:
                await downloader.close()
            assert agent.stats.by_code == {1000: 1}
            assert (await services.state.counters())["pages"]["success"] == 1
        finally:
            await services.close()


async def test_sigkill_of_one_of_two_agents_on_redis_loses_no_page_and_writes_each_item_once(
        tmp_path: Path, redis_url: str) -> None:
    import os
    import signal
    import sys
    import uuid

    import redis.asyncio as aioredis
    import yaml

    from tests.agents.test_crawl import SlowSite
    from tests.helpers import wait_for

    prefix = f"t-agents-{uuid.uuid4().hex[:8]}:"
    stream = f"{prefix}items"
    cfg_file = tmp_path / "crawlhub.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"),
        "storage": {"queues": redis_url, "state": redis_url, "frontier": redis_url,
                    "redis_prefix": prefix},
        "inbound": [{"name": "http", "class": "http"}],
        "frontier": {"site": {"segment": "3650d", "exact": True}},
        "outbound": [{"name": "pages", "class": "queue", "frontier": "site",
                      "init": {"key": "pages"}}],
    }))
    (tmp_path / "extract.yaml").write_text("links: {follow: true}\n")
    sink = yaml.safe_dump({"type": "redis_stream", "url": redis_url, "stream": stream,
                           "key": ["url"], "prefix": prefix}, default_flow_style=True).strip()
    argv = [str(Path(sys.executable).parent / "crawlhub"), "agent", "-c", str(cfg_file),
            "--concurrency", "4", "--extract", str(tmp_path / "extract.yaml"),
            "--sink", sink, "--lease", "3"]
    client = aioredis.from_url(redis_url)
    async with SlowSite(pages=300, delay=0.02) as site:
        from crawlhub.config import load_config

        services = await Services.open(load_config(cfg_file))
        agents = []
        try:
            await services.hub.submit([{"url": f"{site.url}/page/0"}])
            agents = [await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
                      for _ in range(2)]
            await wait_for(lambda: sum(site.hits.values()) >= 60, "60 pages fetched",
                           timeout=60)

            async def registered() -> bool:
                agents = await services.agents.agents()
                return {a.info.pid for a in agents} >= {p.pid for p in procs}

            procs = list(agents)
            await wait_for(registered, "both agents registered", timeout=30)  # type: ignore[arg-type]
            os.kill(agents[0].pid, signal.SIGKILL)
            await agents[0].wait()
            queue = services.queues.queue("pages")

            async def done() -> bool:
                return (all(site.hits[f"/page/{n}"] for n in range(300))
                        and not await queue.length() and not await services.state.pending())

            await wait_for(done, "every page fetched and the queue empty",  # type: ignore[arg-type]
                           timeout=120)
            entries: Any = await client.xrange(stream)
            urls = [json.loads(fields[b"data"])["url"] for _, fields in entries]
            assert len(urls) == len(set(urls)) == 300
            assert agents[1].returncode is None  # the survivor did the rest
        finally:
            for proc in agents:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.wait_for(proc.wait(), timeout=30)
            await services.close()
            keys = [k async for k in client.scan_iter(f"{prefix}*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()


async def test_results_pushed_to_a_redis_list_inbound_are_settled_by_the_hub_consuming_it(
        tmp_path: Path, redis_url: str) -> None:
    import uuid

    from crawlhub.agents.agent import RedisListReport

    prefix = f"t-report-{uuid.uuid4().hex[:8]}:"
    cfg = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path),
        "storage": {"queues": redis_url, "state": redis_url, "redis_prefix": prefix},
        "inbound": [{"name": "http", "class": "http"},
                    {"name": "results", "class": "redis_list",
                     "init": {"url": redis_url, "key": f"{prefix}results"}}],
        "outbound": [{"name": "pages", "class": "queue", "init": {"key": "pages"},
                      "retry_limits": 1}],
    })
    async with Site() as site:
        services = await Services.open(cfg)
        report = RedisListReport(redis_url, f"{prefix}results")
        try:
            await services.start()  # consumes the results list
            await services.hub.submit([{"url": f"{site.url}/page/{n}"} for n in range(5)]
                                      + [{"url": f"{site.url}/status/500"}])
            downloader = Downloader()
            agent = Agent({"pages": services.queues.queue("pages")}, downloader,
                          report=report, concurrency=4)
            try:
                await run_until_idle(services, agent)
            finally:
                await downloader.close()
            counters = (await services.state.counters())["pages"]
            assert counters["success"] == 5 and counters["failed"] == 1
            assert site.hits["/status/500"] == 2  # retried once by the hub's rule
        finally:
            await report.close()
            await services.close()
            import redis.asyncio as aioredis

            client = aioredis.from_url(redis_url)
            keys = [k async for k in client.scan_iter(f"{prefix}*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()


async def test_an_agent_keeps_leasing_after_its_queue_backend_failed_once(
        tmp_path: Path) -> None:
    from crawlhub.core.errors import BackendUnavailable

    class FailsOnce:
        """The real queue, whose first lease meets an outage."""

        def __init__(self, queue: Any) -> None:
            self.queue, self.failed = queue, False

        async def lease(self, n: int, visibility_timeout: float) -> Any:
            if not self.failed:
                self.failed = True
                raise BackendUnavailable("queue backend unreachable")
            return await self.queue.lease(n, visibility_timeout)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.queue, name)

    async with Site() as site:
        services = await Services.open(config(tmp_path))
        try:
            await services.hub.submit([{"url": f"{site.url}/page/{n}"} for n in range(3)])
            queue = FailsOnce(services.queues.queue("pages"))
            downloader = Downloader()
            agent = Agent({"pages": queue}, downloader,  # type: ignore[dict-item]
                          report=HubReport(services.hub, "http"), concurrency=2)
            try:
                await run_until_idle(services, agent)
            finally:
                await downloader.close()
            assert queue.failed and agent.stats.pages == 3
        finally:
            await services.close()

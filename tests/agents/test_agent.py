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
from crawlhub.service import Services
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

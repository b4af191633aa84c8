"""``crawlhub agent`` processes on one Redis: ``--per-domain`` holds every agent to the
domain's concurrency through the shared domain gate, and links found by a task with its
own ``extract`` (a named set of the --extract file) carry it to the pages they lead to."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crawlhub.config import load_config
from crawlhub.services import Services
from tests.agents.servers import Site
from tests.agents.test_politeness_processes import CountingSite
from tests.helpers import wait_for
from tests.queues.conftest import delete_prefix

CRAWLHUB = str(Path(sys.executable).parent / "crawlhub")


class Cluster:
    """A config on Redis under a prefix of its own, the test's hub services on it, and
    the ``crawlhub agent`` processes started with :meth:`agent`."""

    def __init__(self, tmp_path: Path, redis_url: str, frontier: bool = False,
                 agent: dict[str, Any] | None = None) -> None:
        self.prefix = f"t-cli-{uuid.uuid4().hex[:8]}:"
        self.redis_url = redis_url
        outbound: dict[str, Any] = {"name": "pages", "class": "queue",
                                    "init": {"key": "pages"}}
        cfg: dict[str, Any] = {
            "data_dir": str(tmp_path / "data"),
            "storage": {"queues": redis_url, "state": redis_url, "frontier": redis_url,
                        "redis_prefix": self.prefix},
            "inbound": [{"name": "http", "class": "http"}],
            "outbound": [outbound],
        }
        if agent:
            cfg["agent"] = agent
        if frontier:
            cfg["frontier"] = {"site": {"segment": "3650d", "exact": True}}
            outbound["frontier"] = "site"
        self.file = tmp_path / "crawlhub.yaml"
        self.file.write_text(yaml.safe_dump(cfg))
        self.services: Services | None = None
        self.procs: list[asyncio.subprocess.Process] = []

    async def open(self) -> Services:
        self.services = await Services.open(load_config(self.file))
        return self.services

    async def agent(self, *args: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            CRAWLHUB, "agent", "-c", str(self.file), *args, stderr=asyncio.subprocess.PIPE)
        self.procs.append(proc)
        return proc

    async def registered(self) -> bool:
        assert self.services is not None
        pids = {a.info.pid for a in await self.services.agents.agents()}
        return pids >= {p.pid for p in self.procs}

    async def done(self) -> bool:
        assert self.services is not None
        return (not await self.services.queues.queue("pages").length()
                and not await self.services.state.pending())

    async def stop_agents(self) -> list[int]:
        codes = []
        for proc in self.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            codes.append(await asyncio.wait_for(proc.wait(), timeout=60))
        return codes

    async def close(self) -> None:
        await self.stop_agents()
        if self.services is not None:
            await self.services.close()
        await delete_prefix(self.redis_url, self.prefix)


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str
                  ) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, redis_url, agent=getattr(request, "param", None))
    yield c
    await c.close()


@pytest.mark.parametrize(("cluster", "args"), [
    (None, ["--per-domain", "2"]),
    ({"politeness": {"per_domain": 2}}, []),  # the config's agent section, no option
], indirect=["cluster"], ids=["option", "config"])
async def test_two_agents_with_per_domain_2_never_have_more_than_2_requests_on_the_site(
        cluster: Cluster, args: list[str]) -> None:
    services = await cluster.open()
    async with CountingSite() as site:
        for _ in range(2):
            await cluster.agent("--concurrency", "8", *args)
        await wait_for(cluster.registered, "both agents registered", timeout=60)  # type: ignore[arg-type]
        await services.hub.submit([{"url": f"{site.url}/work?n={n}"} for n in range(40)])
        await wait_for(cluster.done, "every task done", timeout=120)  # type: ignore[arg-type]
        assert site.hits == 40
        assert 1 <= site.peak <= 2
        assert await cluster.stop_agents() == [0, 0]


async def test_links_found_by_a_task_with_a_named_rule_set_carry_it_to_their_pages(
        tmp_path: Path, redis_url: str) -> None:
    cluster = Cluster(tmp_path, redis_url, frontier=True)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({
        "fields": {"title_text": {"css": "title::text"}},  # the default: no links
        "rules": {"crawl": {"fields": {"h1": {"css": "h1::text"}}, "links": {"follow": True}}},
    }))
    out = tmp_path / "items.jsonl"
    sink = yaml.safe_dump({"type": "jsonl", "path": str(out), "key": ["url"]},
                          default_flow_style=True).strip()
    try:
        services = await cluster.open()
        async with Site(pages=20) as site:
            await cluster.agent("--concurrency", "4", "--extract", str(rules), "--sink", sink)
            await services.hub.submit([{"url": f"{site.url}/page/0", "extract": "crawl"}])

            async def crawled() -> bool:
                return (all(site.hits[f"/page/{n}"] for n in range(20))
                        and await cluster.done())

            await wait_for(crawled, "every page of the site crawled", timeout=120)  # type: ignore[arg-type]
            assert await cluster.stop_agents() == [0]
            items = [json.loads(line) for line in out.read_text().splitlines()]
            assert sorted(i["url"] for i in items) == sorted(
                f"{site.url}/page/{n}" for n in range(20))
            assert all(i["h1"] == f"Page {i['url'].rsplit('/', 1)[1]}" and "title_text" not in i
                       for i in items)
            assert {site.hits[f"/page/{n}"] for n in range(20)} == {1}
    finally:
        await cluster.close()


async def test_the_config_agent_section_sets_headers_ban_rules_proxies_codes_and_sink(
        tmp_path: Path, redis_url: str) -> None:
    from tests.agents.servers import ForwardProxy

    out = tmp_path / "items.jsonl"
    async with Site(pages=5) as site, ForwardProxy(ban_body="<p>captcha</p>") as banned, \
            ForwardProxy() as good:
        cluster = Cluster(tmp_path, redis_url, agent={
            "concurrency": 4,
            "downloader": {"headers": {"User-Agent": "testbot/1.0"},
                           "ban": {"body_regex": "captcha", "retries": 3},
                           "proxies": [banned.url, good.url]},
            "result_codes": {"statuses": {404: 1000}},  # a gone page is done, not retried
            "politeness": {"robots": False},
            "sink": {"type": "jsonl", "path": str(out), "key": ["url"]},
        })
        try:
            services = await cluster.open()
            await cluster.agent()  # no options: all of it comes from the config
            ua = {"fields": {"ua": {"regex": '"user-agent": "([^"]+)"'}}}
            await services.hub.submit(
                [{"url": f"{site.url}/page/{n}"} for n in range(5)]
                + [{"url": f"{site.url}/status/404"}, {"url": f"{site.url}/echo",
                                                       "extract": ua}])
            await wait_for(cluster.done, "every task done", timeout=120)  # type: ignore[arg-type]
            assert await cluster.stop_agents() == [0]
            items = {i["url"]: i for i in map(json.loads, out.read_text().splitlines())}
            assert sorted(items) == sorted([f"{site.url}/page/{n}" for n in range(5)]
                                           + [f"{site.url}/echo"])
            assert items[f"{site.url}/echo"]["ua"] == "testbot/1.0"
            counters = (await services.state.counters())["pages"]
            assert counters["success"] == 7 and not counters.get("retried")
            assert site.hits["/status/404"] == 1
            # every page came through the good proxy; the banned one was retired
            assert {u for u in good.seen} >= {f"{site.url}/page/{n}" for n in range(5)}
            assert len(banned.seen) <= 4  # at most the requests already on their way to it
        finally:
            await cluster.close()

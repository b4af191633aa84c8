"""The download center as it runs: ``crawlhub center`` and ``crawlhub agent --center``
processes on real Redis, a job in the test. kill -9 an agent (random: its requests go to
the other; chained: those bound to it are answered ``skipped``), kill -9 one of two
centers, stop the broker for 10 s and bring it back: every request is answered exactly
once, none is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crawlhub.center import CenterClient, open_bus
from crawlhub.core.signing import Signer
from tests.agents.test_crawl import SlowSite
from tests.helpers import wait_for
from tests.servers import throwaway_valkey

CRAWLHUB = str(Path(sys.executable).parent / "crawlhub")


class Cluster:
    """Centers and agents as processes sharing one broker under a fresh prefix, every
    message signed with one key (``center.key``), as a distributed set-up should run."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.prefix = f"p{uuid.uuid4().hex[:8]}:"
        self.key = uuid.uuid4().hex + uuid.uuid4().hex
        self.config = tmp / "center.yaml"
        self.config.write_text(
            f"storage: {{redis_prefix: '{self.prefix}'}}\n"
            f"center: {{url: '{url}', dead_after: 2, beat_every: 0.3, claim_after: 1,"
            f" sync_interval: 1, key: '{self.key}'}}\n")
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(self, name: str, *args: str) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it
        self.procs[name] = await asyncio.create_subprocess_exec(
            CRAWLHUB, *args, "-c", str(self.config), "--data-dir", str(self.tmp / name),
            stdout=log, stderr=log)

    async def center(self, name: str) -> None:
        await self.start(name, "center", "--id", name)

    async def agent(self, name: str) -> None:
        await self.start(name, "agent", "--center", "config", "--id", name,
                         "--concurrency", "16")

    def kill(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGKILL)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    async def close(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

    def client(self, job: str, **kw: Any) -> CenterClient:
        return CenterClient(open_bus(self.url, prefix=self.prefix,
                                     signer=Signer(self.key)), job,
                            allocate_timeout=20.0, **kw)


@pytest.fixture
async def cluster(redis_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(redis_url, tmp_path)
    try:
        yield c
    finally:
        await c.close()


async def _allocated(cluster: Cluster, job: str, **kw: Any) -> CenterClient:
    """A client allocated once every agent started is live (retried while they start)."""
    for _ in range(40):
        client = cluster.client(job, **kw)
        try:
            await client.open()
            return client
        except Exception:  # noqa: BLE001 - agents still starting
            await client.bus.close()
            await asyncio.sleep(0.5)
    raise AssertionError("never allocated")


async def test_kill_an_agent_and_a_center_mid_crawl_and_lose_nothing(cluster: Cluster) -> None:
    async with SlowSite(pages=300, delay=0.02) as site:
        for name in ("c1", "c2"):
            await cluster.center(name)
        for name in ("a1", "a2"):
            await cluster.agent(name)
        client = await _allocated(cluster, "survive", strategy="fixed", agents=2,
                                  timeout=10.0)
        try:
            async def one(n: int) -> Any:
                return await client.fetch(f"{site.url}/page/{n}")

            tasks = [asyncio.create_task(one(n)) for n in range(300)]
            await wait_for(lambda: sum(t.done() for t in tasks) >= 60, "60 answered",
                           timeout=60)
            cluster.kill("a1")
            cluster.kill("c1")
            replies = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            assert all(r.ok and r.http_status == 200 for r in replies), \
                {r.status for r in replies}
            assert {r.url for r in replies} == {f"{site.url}/page/{n}" for n in range(300)}
            assert client.returned == client.sent == 300  # each answered once
            assert {r.agent for r in replies[-50:]} == {"a2"}
            assert all(site.hits[f"/page/{n}"] >= 1 for n in range(300))
        finally:
            await client.close()
            await client.bus.close()


async def test_chained_requests_bound_to_a_killed_agent_are_skipped(cluster: Cluster) -> None:
    async with SlowSite(pages=50, delay=0.0) as site:
        await cluster.center("c1")
        for name in ("a1", "a2"):
            await cluster.agent(name)
        client = await _allocated(cluster, "chain", strategy="chained", agents=2,
                                  timeout=10.0)
        try:
            roots = await asyncio.gather(*[client.fetch(f"{site.url}/page/{n}")
                                           for n in range(10)])
            on = {r.agent for r in roots}
            assert on <= {"a1", "a2"}
            kids = await asyncio.gather(*[client.fetch(f"{site.url}/page/{20 + n}",
                                                       agent=r.agent)
                                          for n, r in enumerate(roots)])
            assert [k.agent for k in kids] == [r.agent for r in roots]
            victim = roots[0].agent
            cluster.kill(victim)
            await asyncio.sleep(2.5)  # dead_after 2
            after = await asyncio.gather(*[client.fetch(f"{site.url}/page/{40 + n}",
                                                        agent=r.agent)
                                           for n, r in enumerate(roots)])
            for root, reply in zip(roots, after, strict=True):
                if root.agent == victim:
                    assert reply.status == "skipped", reply
                else:
                    assert reply.ok and reply.agent == root.agent
            assert client.returned == client.sent
        finally:
            await client.close()
            await client.bus.close()


async def test_the_broker_stopped_for_ten_seconds_and_restarted(tmp_path: Path) -> None:
    with throwaway_valkey() as server:
        cluster = Cluster(server.url, tmp_path)
        try:
            async with SlowSite(pages=100, delay=0.0) as site:
                await cluster.center("c1")
                for name in ("a1", "a2"):
                    await cluster.agent(name)
                client = await _allocated(cluster, "outage", strategy="random", agents=2,
                                          timeout=8.0, retries=6, broker_retries=15)
                try:
                    first = await asyncio.gather(*[client.fetch(f"{site.url}/page/{n}")
                                                   for n in range(50)])
                    server.stop()
                    later = [asyncio.create_task(client.fetch(f"{site.url}/page/{n}"))
                             for n in range(50, 100)]
                    await asyncio.sleep(10)
                    server.start()
                    rest = await asyncio.wait_for(asyncio.gather(*later), 120)
                    replies = [*first, *rest]
                    assert all(r.ok for r in replies), [(r.status, r.error) for r in replies
                                                        if not r.ok][:5]
                    assert {r.url for r in replies} == {f"{site.url}/page/{n}"
                                                        for n in range(100)}
                    assert client.returned == client.sent == 100
                    # the agents outlived the outage: alive and beating on the new server
                    for name in ("a1", "a2", "c1"):
                        assert cluster.procs[name].returncode is None, cluster.log(name)
                finally:
                    await client.close()
                    await client.bus.close()
        finally:
            await cluster.close()


async def test_a_request_the_broker_never_takes_fails_at_once_not_after_its_timeout(
        tmp_path: Path) -> None:
    """The broker gone for good: a request sent then fails with the broker named as soon
    as the client's broker retries are spent, not after its 60 s reply timeout."""
    from crawlhub.center import CenterError

    with throwaway_valkey() as server:
        cluster = Cluster(server.url, tmp_path)
        try:
            async with SlowSite(pages=5, delay=0.0) as site:
                await cluster.center("c1")
                await cluster.agent("a1")
                client = await _allocated(cluster, "gone", strategy="random", agents=1,
                                          timeout=60.0, retries=0, broker_retries=1)
                try:
                    assert (await client.fetch(f"{site.url}/page/0")).ok
                    server.stop()
                    with pytest.raises(CenterError,
                                       match="broker failed 2 times|replies failed 2 times"):
                        await asyncio.wait_for(client.fetch(f"{site.url}/page/1"), 30)
                    assert client.in_flight == 0
                finally:
                    await client.close()
                    await client.bus.close()
        finally:
            await cluster.close()

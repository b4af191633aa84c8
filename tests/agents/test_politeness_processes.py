"""Politeness across processes, on SQLite and real Redis: two agent processes never run
more than the domain's concurrency against a counting server, and the slots of a process
killed with SIGKILL come back when their leases end."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from aiohttp import web

from crawlhub.agents.politeness import DomainRules, open_gate_store
from tests.agents.servers import _Server
from tests.agents.stores import Backend, backend_fixture  # noqa: F401 - the fixture
from tests.helpers import FakeClock

ROOT = Path(__file__).resolve().parents[2]


class CountingSite(_Server):
    """``/work`` takes a little while; ``peak`` is the most requests seen at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak = 0
        self.hits = 0
        self.app.router.add_get("/work", self.work)

    async def work(self, request: web.Request) -> web.Response:
        self.hits += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            return web.Response(text="ok")
        finally:
            self.in_flight -= 1


async def child(*args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.agents.gate_child", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE)


async def test_two_processes_never_exceed_the_domain_concurrency(backend: Backend) -> None:
    async with CountingSite() as site:
        procs = [await child("fetch", backend.url, backend.prefix, "counted.test", site.url,
                             "25", "4") for _ in range(2)]
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 120)
        assert codes == [0, 0]
        assert site.hits == 50
        assert 1 <= site.peak <= 2


async def test_the_slots_of_a_killed_process_come_back_when_their_lease_ends(
        backend: Backend, clock: FakeClock) -> None:
    proc = await child("hold", backend.url, backend.prefix, "held.test", repr(clock()))
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.split() == [b"held", b"2"]
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    store = open_gate_store(backend.url, prefix=backend.prefix)
    rules = DomainRules(concurrency=2, lease=60)
    try:
        assert (await store.acquire("held.test", 1, clock(), rules, "me")).ids == []
        clock.advance(59)
        assert (await store.acquire("held.test", 1, clock(), rules, "me")).ids == []
        clock.advance(1)
        assert len((await store.acquire("held.test", 2, clock(), rules, "me")).ids) == 2
    finally:
        await store.close()

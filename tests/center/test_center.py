"""The download center in one process, on real Redis and in process: strategies route as
specified, allocation is refused with both numbers, stale and replayed messages are
dropped by their own stamps, dead agents' requests are routed again (chained: skipped),
allocations survive an agent restart, and every request is answered exactly once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crawlhub.agents.registry import open_registry
from crawlhub.center import (
    CenterClient,
    CenterError,
    CenterWorker,
    DownloadCenter,
    open_bus,
)
from crawlhub.center.bus import Envelope
from crawlhub.center.messages import REGISTER, REQUESTS, agent_channel
from tests.agents.servers import Site
from tests.helpers import wait_for

DEAD_AFTER = 1.0


class Rig:
    """A site, a center and agents on one bus (Redis with a fresh prefix, or memory)."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.prefix = f"t{uuid.uuid4().hex[:8]}:"
        self.tmp = tmp
        self.stop = asyncio.Event()
        self.tasks: dict[str, tuple[asyncio.Task[Any], asyncio.Event, Any]] = {}
        self.buses: list[Any] = []
        self.center: DownloadCenter | None = None

    def bus(self) -> Any:
        bus = open_bus(self.url, prefix=self.prefix)
        self.buses.append(bus)
        return bus

    def start_center(self, name: str = "c1", registry: Any = None) -> DownloadCenter:
        center = DownloadCenter(self.bus(), registry=registry, center_id=name,
                                dead_after=DEAD_AFTER, check_every=0.1, claim_after=0.5,
                                sync_interval=0.5)
        self._start(name, center)
        self.center = center
        return center

    async def start(self, agents: int) -> DownloadCenter:
        """The center ``c1`` and agents ``a0``... ``a<agents - 1>``, every one live."""
        center = self.start_center()
        for n in range(agents):
            self.start_agent(f"a{n}")
        await self.live(agents)
        return center

    def start_agent(self, name: str, **kw: Any) -> CenterWorker:
        worker = CenterWorker(self.bus(), name, beat_every=0.1, state_dir=self.tmp, **kw)
        self._start(name, worker)
        return worker

    def _start(self, name: str, thing: Any) -> None:
        stop = asyncio.Event()
        self.tasks[name] = (asyncio.create_task(thing.run(stop)), stop, thing)

    async def halt(self, name: str) -> None:
        """Stop one part as a crash would look from outside: it just goes silent."""
        task, _stop, _ = self.tasks.pop(name)
        task.cancel()
        await asyncio.wait([task], timeout=5)
        assert task.done(), f"{name} did not stop when cancelled"

    async def close(self) -> None:
        tasks = [self.tasks.pop(name) for name in list(self.tasks)]
        for _, stop, _ in tasks:
            stop.set()
        if tasks:
            await asyncio.wait([t for t, _, _ in tasks], timeout=10)
        for bus in self.buses:
            await bus.close()

    def client(self, job: str, **kw: Any) -> CenterClient:
        kw.setdefault("allocate_timeout", 3.0)
        kw.setdefault("timeout", 3.0)
        return CenterClient(self.bus(), job, **kw)

    async def live(self, n: int) -> None:
        assert self.center is not None
        center = self.center
        await wait_for(lambda: len(center.live_agents()) >= n, f"{n} live agents")


@pytest.fixture(params=["redis", "memory"])
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    url = (str(request.getfixturevalue("redis_url")) if request.param == "redis"
           else f"memory://{uuid.uuid4().hex}")
    r = Rig(url, tmp_path)
    try:
        yield r
    finally:
        await r.close()


async def test_strategies_route_as_specified(rig: Rig) -> None:
    async with Site(pages=60) as site:
        await rig.start(agents=3)
        async with rig.client("random", strategy="random") as c:
            assert sorted(c.agents) == ["a0", "a1", "a2"]
            replies = await asyncio.gather(*[c.fetch(f"{site.url}/page/{i}")
                                             for i in range(30)])
            assert {r.agent for r in replies} == {"a0", "a1", "a2"}
        async with rig.client("fixed", strategy="fixed", agents=2) as c:
            replies = await asyncio.gather(*[c.fetch(f"{site.url}/page/{i}")
                                             for i in range(30)])
            assert {r.agent for r in replies} == set(c.agents) and len(c.agents) == 2
        async with rig.client("chained", strategy="chained", agents=2,
                              options={"extract": {"fields": {"h": {"css": "h1::text"}},
                                                   "links": {"follow": True}},
                                       "body": False}) as c:
            roots = await asyncio.gather(*[c.fetch(f"{site.url}/page/{i}") for i in range(6)])
            assert roots[0].fields == {"h": "Page 0"} and roots[0].body == b""
            assert roots[0].links and all(link.startswith(site.url) for link in roots[0].links)
            for root in roots:  # every follow-up lands on its parent's agent
                kids = await asyncio.gather(*[c.fetch(link, agent=root.agent)
                                              for link in root.links or []])
                assert {k.agent for k in kids} == {root.agent}
            assert {r.agent for r in roots} <= set(c.agents)
        assert c.returned == c.sent and c.duplicates == 0
        assert rig.center is not None and rig.center.counters["refused"] == 0


async def test_allocation_fails_with_the_numbers_asked_and_got(rig: Rig) -> None:
    await rig.start(agents=2)
    with pytest.raises(CenterError, match=r"asked for 5 agents \(fixed\), 2 live"):
        async with rig.client("too-many", strategy="fixed", agents=5):
            pass
    # an agent that registers and beats but never reads its commands: no ack
    bus = rig.bus()
    await bus.send(REGISTER, {"kind": "register", "ts": time.time(),
                              "info": {"agent_id": "mute", "host": "h", "pid": 1,
                                       "version": "0"}})
    assert rig.center is not None
    center = rig.center
    await wait_for(lambda: "mute" in center.infos, "the mute agent registered")
    beat = asyncio.create_task(_beat_forever(bus, "mute"))
    try:
        await rig.live(3)
        with pytest.raises(CenterError, match="3 agents for 3 .*2 acknowledged"):
            async with rig.client("deaf", strategy="fixed", agents=3, allocate_timeout=1.0):
                pass
    finally:
        beat.cancel()
    # hostile options: refused by the agents, so by the center
    with pytest.raises(CenterError, match="acknowledged"):
        async with rig.client("bad", strategy="fixed", agents=1, allocate_timeout=1.0,
                              options={"downloader": {"eval": "__import__('os')"}}):
            pass
    with pytest.raises(ValueError, match="strategy"):
        rig.client("x", strategy="roundrobin")


async def _beat_forever(bus: Any, agent: str) -> None:
    from crawlhub.center.messages import BEATS

    while True:
        await bus.send(BEATS, {"kind": "beat", "agent": agent, "ts": time.time(), "beat": {}})
        await asyncio.sleep(0.1)


async def test_a_replayed_old_heartbeat_does_not_revive_a_dead_agent(
        rig: Rig, tmp_path: Path) -> None:
    registry = open_registry(f"sqlite:///{tmp_path / 'agents.db'}", dead_after=DEAD_AFTER)
    try:
        center = rig.start_center(registry=registry)
        rig.start_agent("a0")
        await rig.live(1)
        await rig.halt("a0")
        await wait_for(lambda: not center.alive("a0"), "a0 dead")
        seen = center.seen["a0"]
        # beats replayed after a center restart: stamped by the agent, long ago
        old = [Envelope("1-0", {"kind": "beat", "agent": "a0", "ts": seen - 0.5, "beat": {}}),
               Envelope("2-0", {"kind": "beat", "agent": "a0", "ts": time.time() - 5,
                                "beat": {}})]
        await center.beat(old)
        assert not center.alive("a0") and center.seen["a0"] == seen
        assert center.counters["stale_beats"] >= 2
        # and the registry never moves a last sign of life backwards
        from crawlhub.agents.registry import Heartbeat

        assert await registry.heartbeat_many([("a0", Heartbeat())], at=[seen - 100]) == [True]
        status = await registry.get("a0")
        assert status is not None and status.last_seen == pytest.approx(seen)
        assert not status.alive
    finally:
        await rig.halt("c1")  # the center uses the registry until it stops
        await registry.close()


async def test_a_registration_queued_while_no_center_ran_is_processed(rig: Rig) -> None:
    bus = rig.bus()
    await bus.send(REGISTER, {"kind": "register", "ts": time.time() - 3600,
                              "info": {"agent_id": "early", "host": "h", "pid": 7,
                                       "version": "0"}})
    # and a download whose job gave up long ago
    await bus.send(REQUESTS, {"kind": "download", "job": "gone", "rid": "1",
                              "url": "http://127.0.0.1:9/", "ts": time.time() - 60,
                              "exp": time.time() - 30})
    center = rig.start_center()
    await wait_for(lambda: "early" in center.infos, "the early registration processed")
    await wait_for(lambda: center.counters["stale"] >= 1, "the stale download dropped")
    assert not center.alive("early")  # registered an hour ago, silent since
    assert center.counters["dispatched"] == 0


async def test_an_agent_restart_restores_its_allocations_from_its_file(rig: Rig) -> None:
    async with Site(pages=10) as site:
        rig.start_center()
        worker = rig.start_agent("a0")
        await rig.live(1)
        async with rig.client("keep", strategy="fixed", agents=1,
                              options={"downloader": {"headers": {"X-Job": "keep"}}}) as c:
            assert (await c.fetch(f"{site.url}/page/1")).http_status == 200
            assert worker.state_file is not None and worker.state_file.exists()
            await rig.halt("a0")
            again = rig.start_agent("a0")
            await wait_for(lambda: "keep" in again.jobs, "the allocation reloaded")
            reply = await c.fetch(f"{site.url}/echo")
            assert reply.ok and reply.agent == "a0" and b"keep" in reply.body
        # released: gone from the agent and from its file
        await wait_for(lambda: "keep" not in again.jobs, "the allocation released")
        assert "keep" not in again.state_file.read_text()  # type: ignore[union-attr]


async def test_a_list_of_jobs_read_before_an_allocation_was_stored_does_not_drop_it(
        rig: Rig) -> None:
    # A center reads an agent's jobs for its registration while an allocation to that
    # agent awaits its acks: the list lacks the job and reaches the agent after the
    # allocate. The job was dropped and its every download there answered "holds no
    # allocation" (seen under load in tests/security/test_streams.py). Within its
    # allocation's window it is kept; past it, a list that lacks a job still drops it.
    async with Site(pages=10) as site:
        rig.start_center()
        worker = rig.start_agent("a0")
        await rig.live(1)
        async with rig.client("fresh", strategy="fixed", agents=1) as c:
            stale = {"kind": "allocations", "jobs": [], "ts": time.time()}
            await rig.bus().send(agent_channel("a0"), stale)
            # (the agent's channel is ordered: the list is served before this download)
            reply = await c.fetch(f"{site.url}/page/1")
            assert reply.ok, reply.error
            assert "fresh" in worker.jobs
            worker.jobs["fresh"].settling = 0.0  # its allocation's window is over
            await rig.bus().send(agent_channel("a0"), stale)
            await wait_for(lambda: "fresh" not in worker.jobs, "a job no list holds dropped")


async def test_a_dead_agents_requests_go_to_another_and_chained_ones_are_skipped(
        rig: Rig) -> None:
    async with Site(pages=200) as site:
        center = await rig.start(agents=2)
        async with rig.client("fx", strategy="fixed", agents=2, timeout=20.0) as c:
            await rig.halt("a0")  # silent from now on: what it is sent piles up
            replies = await asyncio.gather(*[c.fetch(f"{site.url}/page/{i}")
                                             for i in range(100)])
            assert all(r.ok for r in replies)
            assert {r.agent for r in replies} == {"a1"}
            assert center.counters["rerouted"] > 0  # taken back from a0, not lost
            assert c.returned == c.sent == 100 and c.duplicates == 0
            assert site.hits.total() == 100  # each page fetched once
        rig.start_agent("a0")
        await rig.live(2)
        async with rig.client("ch", strategy="chained", agents=2) as c:
            root = await c.fetch(f"{site.url}/page/0")
            other = next(a for a in c.agents if a != root.agent)
            await rig.halt(root.agent)
            await wait_for(lambda: not center.alive(root.agent), "the parent's agent dead")
            bound = await c.fetch(f"{site.url}/page/1", agent=root.agent)
            assert bound.status == "skipped" and root.agent in bound.error
            free = await c.fetch(f"{site.url}/page/2")
            assert free.ok and free.agent == other
            assert await bus_empty(rig, agent_channel(root.agent))


async def bus_empty(rig: Rig, channel: str) -> bool:
    return (await rig.bus().length([channel])) == [0]


async def test_no_reply_is_retried_then_fatal_and_the_window_stops_the_sender(
        rig: Rig) -> None:
    async with Site(pages=10) as site:
        await rig.start(agents=1)
        c = rig.client("lonely", strategy="fixed", agents=1, timeout=0.3, retries=2, window=2)
        await c.open()
        try:
            assert (await c.fetch(f"{site.url}/page/1")).ok
            await rig.halt("c1")  # no center: nothing is answered any more
            with pytest.raises(CenterError, match="unanswered after 3 sends"):
                await c.fetch(f"{site.url}/page/2")
            assert c.retried == 2 and c.failed == 1
            waiting = [asyncio.create_task(c.fetch(f"{site.url}/page/{i}")) for i in (3, 4)]
            await asyncio.sleep(0.05)
            with pytest.raises(CenterError, match="window 2"):
                await c.fetch(f"{site.url}/page/5")
            for task in waiting:
                with pytest.raises(CenterError):
                    await task
        finally:
            await c.close()


async def test_duplicate_replies_are_absorbed(rig: Rig) -> None:
    async with Site(pages=10) as site:
        await rig.start(agents=1)
        async with rig.client("dup", strategy="fixed", agents=1) as c:
            reply = await c.fetch(f"{site.url}/page/1")
            late = {"kind": "reply", "rid": reply.rid, "status": "ok", "agent": "a0",
                    "code": 500}
            await rig.bus().send(c.channel, late)
            await wait_for(lambda: c.duplicates == 1, "the late reply seen")
            assert c.returned == 1
            # hostile replies and requests: no crash, no answer invented
            await rig.bus().send(c.channel, {"kind": "reply", "rid": None})
            bad = await c.fetch("not a url at all")
            assert bad.ok and bad.outcome == "invalid_url"


async def test_an_orphaned_request_of_a_dead_center_is_served_by_another(rig: Rig) -> None:
    async with Site(pages=10) as site:
        rig.start_agent("a0")
        first = rig.start_center("c1")
        await rig.live(1)
        async with rig.client("orphan", strategy="fixed", agents=1, timeout=10.0,
                              retries=0) as c:
            await rig.halt("c1")
            # c1 reads the request (it stays pending on c1) and dies before serving it
            task = asyncio.create_task(c.fetch(f"{site.url}/page/3"))
            # (the job's own messages on the channel may come first: c1 takes those too)
            taken: list[Any] = []

            async def fetch_taken() -> list[Any]:
                taken.extend(await first.bus.read(REQUESTS, "c1", count=10, block=0.1))
                return [m for m in taken if "url" in m.header]

            got = await wait_for(fetch_taken, "c1 took the request")
            assert got[0].header["url"].endswith("/page/3")
            second = rig.start_center("c2")
            reply = await task  # served by c2 once the message sat idle: no send again
            assert reply.ok and c.retried == 0
            assert second.counters["claimed"] >= 1


async def test_a_cancel_dressed_as_a_broker_error_still_stops_a_centers_loop(
        redis_url: str) -> None:
    """redis-py can let a cancel out as a connection error, which the bus reports as a
    BusError; the center's retry loop must still end when cancelled (a halted center's
    loop that ran on kept the event loop's shutdown waiting for ever in CI)."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from crawlhub.center.bus import RedisBus

    bus = RedisBus(redis_url)
    center = DownloadCenter(bus, center_id="c-cancel")
    reads = 0

    async def step() -> None:
        nonlocal reads
        reads += 1

        async def read() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise RedisConnectionError("Connection closed by server.") from None

        await bus._call("read", read())

    try:
        task = asyncio.create_task(center._forever(asyncio.Event(), "reading", step))
        await asyncio.sleep(0.05)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=3)
        assert task in done and task.cancelled() and reads == 1
    finally:
        if not task.done():
            task.cancel()
        await bus.close()


async def test_an_error_reply_amid_a_send_is_a_bus_error_and_the_connection_stays_in_step(
        redis_url: str, unique_name: str) -> None:
    """The bus writes a batch of commands at once and reads their replies itself: an
    error reply in the middle (a channel's key holding a string) names the broker's
    error, the other sends went, and the next exchange on the same connection reads its
    own replies, not the ones left behind."""
    import redis.asyncio as aioredis

    from crawlhub.center.bus import BusError, RedisBus

    bus = RedisBus(redis_url, prefix=f"{unique_name}:")
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.set(bus.key("broken"), "not a stream")
        with pytest.raises(BusError, match="failed to send 3 messages: ResponseError: WRONGTYPE"):
            await bus.send_many([("a", {"n": 1}, b""), ("broken", {"n": 2}, b""),
                                 ("a", {"n": 3}, b"body")])
        got = await bus.read("a", "c1", count=10, block=0.1)
        assert [(e.header["n"], e.body) for e in got] == [(1, b""), (3, b"body")]
        await bus.send_many([("a", {"n": 4}, b"")], ack={"a": [e.id for e in got]})
        assert [e.header["n"] for e in await bus.read("a", "c1", count=10, block=0.1)] == [4]
        assert await bus.read("a", "c1", count=10, block=0.1) == []
    finally:
        keys = [k async for k in client.scan_iter(match=f"{unique_name}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        await bus.close()

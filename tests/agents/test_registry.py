"""The agent registry's conformance suite: the same behaviour on a SQLite file and on real
Redis, liveness driven by a fake clock (no test waits for real seconds)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from crawlhub.agents.registry import (
    AgentInfo,
    AgentRegistry,
    Heartbeat,
    LoadMeter,
    listing,
    open_registry,
)
from crawlhub.core.errors import ConfigError
from tests.agents.stores import Backend, backend_fixture  # noqa: F401 - the fixture
from tests.helpers import FakeClock


def info(agent_id: str = "a1", **kw: object) -> AgentInfo:
    fields: dict[str, object] = {"host": "box", "pid": 42, "version": "1.0",
                                 "queues": ["spider"], "started": 1.0, "concurrency": 64}
    fields.update(kw)
    return AgentInfo(agent_id=agent_id, **fields)  # type: ignore[arg-type]


@pytest.fixture
async def registry(backend: Backend, clock: FakeClock) -> AsyncIterator[AgentRegistry]:
    reg = open_registry(backend.url, prefix=backend.prefix, clock=clock)
    yield reg
    await reg.close()


async def test_a_registered_agent_is_listed_alive_with_what_it_said(
        registry: AgentRegistry, clock: FakeClock) -> None:
    await registry.register(info("a1", labels={"region": "eu"}))
    [status] = await registry.agents()
    assert status.info == info("a1", labels={"region": "eu"})
    assert status.alive and status.beat is None and status.last_seen == clock()
    assert await registry.live() == ["a1"]


async def test_a_heartbeat_stores_the_load_and_keeps_the_agent_alive(
        registry: AgentRegistry, clock: FakeClock) -> None:
    await registry.register(info("a1"))
    clock.advance(10)
    beat = Heartbeat(memory=123, cpu=55.5, downloaders=3, in_flight=7, qps=12.5, pages=100,
                     errors=2)
    assert await registry.heartbeat("a1", beat) is True
    clock.advance(10)  # 20 s after registering, 10 s after the beat
    status = await registry.get("a1")
    assert status is not None and status.alive and status.beat == beat
    assert status.last_seen == clock() - 10


async def test_an_agent_silent_for_dead_after_is_dead_but_still_listed(
        registry: AgentRegistry, clock: FakeClock) -> None:
    await registry.register(info("a1"))
    await registry.register(info("a2"))
    clock.advance(5)
    await registry.heartbeat("a2", Heartbeat())
    clock.advance(registry.dead_after - 5)  # a1 silent exactly dead_after, a2 for less
    listed = {s.agent_id: s.alive for s in await registry.agents()}
    assert listed == {"a1": False, "a2": True}
    assert await registry.live() == ["a2"]


async def test_dead_after_is_configurable(backend: Backend, clock: FakeClock) -> None:
    reg = open_registry(backend.url, prefix=backend.prefix, clock=clock, dead_after=2)
    try:
        await reg.register(info("a1"))
        clock.advance(1.5)
        assert await reg.live() == ["a1"]
        clock.advance(0.5)
        assert await reg.live() == []
    finally:
        await reg.close()


async def test_a_dead_agent_is_forgotten_after_the_retention_and_must_register_again(
        backend: Backend, clock: FakeClock) -> None:
    reg = open_registry(backend.url, prefix=backend.prefix, clock=clock, dead_after=11,
                        retention=100)
    try:
        await reg.register(info("gone"))
        await reg.register(info("kept"))
        clock.advance(111)
        await reg.heartbeat("kept", Heartbeat())
        assert [s.agent_id for s in await reg.agents()] == ["kept"]
        assert await reg.get("gone") is None
        assert await reg.heartbeat("gone", Heartbeat()) is False
        await reg.register(info("gone"))
        assert await reg.live() == ["gone", "kept"]
        clock.advance(111)
        assert await reg.forget_dead() == 2
        assert await reg.agents() == []
    finally:
        await reg.close()


async def test_a_heartbeat_of_an_unknown_agent_stores_nothing(
        registry: AgentRegistry) -> None:
    assert await registry.heartbeat("nobody", Heartbeat(pages=1)) is False
    assert await registry.agents() == []
    assert await registry.live() == []


async def test_registering_again_replaces_the_registration_and_drops_the_old_beat(
        registry: AgentRegistry, clock: FakeClock) -> None:
    await registry.register(info("a1", pid=1))
    await registry.heartbeat("a1", Heartbeat(pages=10))
    clock.advance(100)
    await registry.register(info("a1", pid=2))
    status = await registry.get("a1")
    assert status is not None and status.info.pid == 2 and status.beat is None
    assert status.alive


async def test_heartbeat_many_answers_per_agent(registry: AgentRegistry) -> None:
    await registry.register(info("a1"))
    await registry.register(info("a2"))
    answers = await registry.heartbeat_many([("a1", Heartbeat(pages=1)), ("x", Heartbeat()),
                                             ("a2", Heartbeat(pages=2))])
    assert answers == [True, False, True]
    beats = {s.agent_id: s.beat.pages if s.beat else None for s in await registry.agents()}
    assert beats == {"a1": 1, "a2": 2}
    assert await registry.heartbeat_many([]) == []


async def test_unregister_forgets_at_once(registry: AgentRegistry) -> None:
    await registry.register(info("a1"))
    assert await registry.unregister("a1") is True
    assert await registry.unregister("a1") is False
    assert await registry.agents() == [] and await registry.live() == []


async def test_two_registries_on_one_backend_see_the_same_agents(
        backend: Backend, clock: FakeClock) -> None:
    one = open_registry(backend.url, prefix=backend.prefix, clock=clock)
    two = open_registry(backend.url, prefix=backend.prefix, clock=clock)
    try:
        await one.register(info("a1"))
        await two.register(info("a2"))
        await two.heartbeat("a1", Heartbeat(in_flight=4))
        assert [s.agent_id for s in await one.agents()] == ["a1", "a2"]
        status = await one.get("a1")
        assert status is not None and status.beat == Heartbeat(in_flight=4)
    finally:
        await one.close()
        await two.close()


async def test_the_listing_form_is_flat_and_says_whether_the_agent_has_beaten(
        registry: AgentRegistry) -> None:
    await registry.register(info("a1"))
    [status] = await registry.agents()
    row = status.as_dict()
    assert row["agent_id"] == "a1" and row["alive"] is True and row["beats"] is False
    assert row["pages"] == 0 and row["queues"] == ["spider"] and row["concurrency"] == 64


def test_a_url_of_another_backend_is_a_config_error_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="storage.agents"):
        open_registry("postgresql://u@h/db")


def test_a_nonpositive_dead_after_is_refused() -> None:
    with pytest.raises(ValueError, match="dead_after"):
        open_registry("sqlite:///x.db", dead_after=0)


def test_the_load_meter_reports_resident_memory_and_cpu_since_the_last_sample() -> None:
    cpu = FakeClock(start=10.0)
    wall = FakeClock(start=100.0)
    meter = LoadMeter(cpu_clock=cpu, wall_clock=wall)
    cpu.advance(0.5)
    wall.advance(2.0)
    memory, percent = meter.sample()
    assert memory > 1_000_000 and percent == 25.0
    wall.advance(1.0)
    assert meter.sample()[1] == 0.0
    assert meter.sample()[1] == 0.0  # no time passed: no division by zero


async def test_listing_counts_all_agents_and_filters_by_liveness(
        registry: AgentRegistry, clock: FakeClock) -> None:
    await registry.register(info("a1"))
    clock.advance(registry.dead_after)
    await registry.register(info("a2"))

    every = await listing(registry)
    assert [r["agent_id"] for r in every["agents"]] == ["a1", "a2"]
    assert (every["alive"], every["dead"], every["dead_after"]) == (1, 1, registry.dead_after)
    dead = await listing(registry, alive=False)
    assert [r["agent_id"] for r in dead["agents"]] == ["a1"]
    assert (dead["alive"], dead["dead"]) == (1, 1)

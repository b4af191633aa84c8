"""The domain gate's conformance suite: the same slots, pace and backoff on a SQLite file
and on real Redis, every lease driven by a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from crawlhub.agents.politeness import (
    DomainGate,
    DomainRules,
    GateStore,
    Grant,
    domain_of,
    open_gate,
    open_gate_store,
    retry_after_seconds,
)
from crawlhub.core.errors import ConfigError
from tests.agents.stores import Backend, backend_fixture  # noqa: F401 - the fixture
from tests.helpers import FakeClock, wait_for

RULES = DomainRules(concurrency=2, lease=60, backoff=30, backoff_cap=600)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[GateStore]:
    s = open_gate_store(backend.url, prefix=backend.prefix)
    yield s
    await s.close()


@pytest.fixture
async def gate(backend: Backend, clock: FakeClock) -> AsyncIterator[DomainGate]:
    g = open_gate(backend.url, prefix=backend.prefix, rules=RULES, clock=clock,
                  sleep=clock.sleep)
    yield g
    await g.close()


class CountingStore:
    """A store that counts the acquire round trips a gate makes."""

    def __init__(self, inner: GateStore) -> None:
        self.inner = inner
        self.acquires = 0

    async def acquire(self, *args: object, **kw: object) -> Grant:
        self.acquires += 1
        return await self.inner.acquire(*args, **kw)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_a_domain_grants_its_concurrency_then_nothing_until_a_release(
        store: GateStore, clock: FakeClock) -> None:
    now = clock()
    first = await store.acquire("a.test", 1, now, RULES, "t1")
    second = await store.acquire("a.test", 1, now, RULES, "t2")
    assert len(first.ids) == len(second.ids) == 1
    full = await store.acquire("a.test", 1, now, RULES, "t3")
    assert full.ids == [] and full.reason == "full" and full.wait == pytest.approx(60)
    assert (await store.acquire("b.test", 1, now, RULES, "t4")).ids == ["t4:0"]  # others free
    assert await store.held("a.test", now) == 2


async def test_acquire_many_grants_what_fits_in_one_round_trip(
        backend: Backend, clock: FakeClock) -> None:
    counting = CountingStore(open_gate_store(backend.url, prefix=backend.prefix))
    gate = DomainGate(counting, rules=DomainRules(concurrency=3), clock=clock,  # type: ignore[arg-type]
                      sleep=clock.sleep)
    try:
        slots = await gate.acquire_many("a.test", 5)
        assert len(slots) == 3 and len({s.id for s in slots}) == 3
        assert counting.acquires == 1
        assert await gate.held("a.test") == 3
        await gate.release_many([(s, 200, None) for s in slots])
        assert await gate.held("a.test") == 0
    finally:
        await gate.close()


async def test_a_slot_never_released_comes_back_when_its_lease_ends(
        store: GateStore, clock: FakeClock) -> None:
    now = clock()
    await store.acquire("a.test", 2, now, RULES, "dead")
    assert (await store.acquire("a.test", 1, now + 59.9, RULES, "x")).ids == []
    later = await store.acquire("a.test", 2, now + 60, RULES, "live")
    assert later.ids == ["live:0", "live:1"]


async def test_a_delay_paces_starts_across_gates(backend: Backend, clock: FakeClock) -> None:
    rules = DomainRules(concurrency=5, delay=2.5)
    one = open_gate(backend.url, prefix=backend.prefix, rules=rules, clock=clock,
                    sleep=clock.sleep)
    two = open_gate(backend.url, prefix=backend.prefix, rules=rules, clock=clock,
                    sleep=clock.sleep)
    try:
        start = clock()
        assert len(await one.acquire_many("a.test", 4)) == 1  # one per trip with a delay
        await two.acquire("a.test")
        assert clock.sleeps == [pytest.approx(2.5)]
        assert clock() == pytest.approx(start + 2.5)
    finally:
        await one.close()
        await two.close()


async def test_retry_after_backs_the_whole_domain_off_for_every_gate(
        backend: Backend, gate: DomainGate, clock: FakeClock) -> None:
    other = open_gate(backend.url, prefix=backend.prefix, rules=RULES, clock=clock,
                      sleep=clock.sleep)
    try:
        slot = await gate.acquire("a.test")
        await gate.release(slot, 200, retry_after=45)
        start = clock()
        await other.acquire("a.test")
        assert clock.sleeps == [pytest.approx(45)] and clock() == pytest.approx(start + 45)
        assert len(await other.acquire_many("b.test", 2)) == 2  # other domains unaffected
    finally:
        await other.close()


@pytest.mark.parametrize("status", [429, 503])
async def test_a_429_or_503_without_retry_after_backs_off_by_the_rules(
        gate: DomainGate, store: GateStore, clock: FakeClock, status: int) -> None:
    await gate.release(await gate.acquire("a.test"), status)
    grant = await store.acquire("a.test", 1, clock(), RULES, "x")
    assert grant.reason == "pace" and grant.wait == pytest.approx(30)


async def test_retry_after_is_capped_and_a_longer_backoff_is_kept(
        gate: DomainGate, store: GateStore, clock: FakeClock) -> None:
    slots = await gate.acquire_many("a.test", 2)
    await gate.release(slots[0], 429, retry_after=10**9)
    await gate.release(slots[1], 429, retry_after=5)
    grant = await store.acquire("a.test", 1, clock(), RULES, "x")
    assert grant.wait == pytest.approx(600)


async def test_a_200_without_retry_after_does_not_back_off(
        gate: DomainGate, store: GateStore, clock: FakeClock) -> None:
    await gate.release(await gate.acquire("a.test"), 200)
    await gate.release(await gate.acquire("a.test"), 404, retry_after=None)
    assert len((await store.acquire("a.test", 2, clock(), RULES, "x")).ids) == 2


async def test_a_waiting_acquire_gets_the_slot_this_process_releases(
        backend: Backend, clock: FakeClock) -> None:
    # Real sleeps, frozen clock: only the release can wake the waiter (leases never end).
    gate = open_gate(backend.url, prefix=backend.prefix, rules=RULES, clock=clock)
    try:
        held = await gate.acquire_many("a.test", 2)
        waiter = asyncio.create_task(gate.acquire("a.test"))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await gate.release(held[0])
        slot = await asyncio.wait_for(waiter, 30)
        assert slot.domain == "a.test" and await gate.held("a.test") == 2
    finally:
        await gate.close()


async def test_concurrent_releases_share_round_trips_and_all_land(
        gate: DomainGate, clock: FakeClock) -> None:
    slots = await gate.acquire_many("a.test", 2) + await gate.acquire_many("b.test", 2)
    await asyncio.gather(*(gate.release(s) for s in slots))
    assert await gate.held("a.test") == 0 and await gate.held("b.test") == 0


async def test_per_domain_rules_override_the_default(backend: Backend, clock: FakeClock
                                                     ) -> None:
    gate = open_gate(backend.url, prefix=backend.prefix, rules=RULES, clock=clock,
                     sleep=clock.sleep, domains={"Big.test": DomainRules(concurrency=10)})
    try:
        assert len(await gate.acquire_many("big.test", 20)) == 10
        assert len(await gate.acquire_many("small.test", 20)) == 2
    finally:
        await gate.close()


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = 1_700_000_000.0
    assert retry_after_seconds("120", now) == 120
    when = datetime.fromtimestamp(now + 90, tz=UTC)
    assert retry_after_seconds(format_datetime(when, usegmt=True), now) == pytest.approx(90)
    assert retry_after_seconds("soon", now) is None
    assert retry_after_seconds(None, now) is None
    assert retry_after_seconds("-5", now) is None


def test_the_domain_of_a_url_is_its_lower_case_host() -> None:
    assert domain_of("https://Example.COM:8443/a?b") == "example.com"
    with pytest.raises(ValueError, match="no host"):
        domain_of("/relative")


def test_bad_rules_are_refused_with_the_name_of_the_setting() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        DomainRules(concurrency=0)
    with pytest.raises(ValueError, match="delay"):
        DomainRules(delay=-1)
    with pytest.raises(ValueError, match="lease"):
        DomainRules(lease=0)


def test_a_url_of_another_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="domain gate"):
        open_gate("kafka://h:9092")


async def test_concurrent_acquires_of_one_domain_share_round_trips(
        backend: Backend, clock: FakeClock) -> None:
    counting = CountingStore(open_gate_store(backend.url, prefix=backend.prefix))
    gate = DomainGate(counting, rules=DomainRules(concurrency=10), clock=clock,  # type: ignore[arg-type]
                      sleep=clock.sleep)
    try:
        slots = await asyncio.gather(*(gate.acquire("a.test") for _ in range(10)))
        assert len({s.id for s in slots}) == 10
        assert counting.acquires <= 2  # the first alone, then the nine that queued meanwhile
        assert await gate.held("a.test") == 10
    finally:
        await gate.close()


async def test_queued_acquires_are_served_in_order_as_slots_free(
        backend: Backend, clock: FakeClock) -> None:
    gate = open_gate(backend.url, prefix=backend.prefix, rules=RULES, clock=clock)
    try:
        held = await gate.acquire_many("a.test", 2)
        order: list[int] = []

        async def take(i: int) -> None:
            slot = await gate.acquire("a.test")
            order.append(i)
            await gate.release(slot)

        takers = [asyncio.create_task(take(i)) for i in range(4)]
        await asyncio.sleep(0.05)
        assert order == []
        await gate.release_many([(s, None, None) for s in held])
        await asyncio.wait_for(asyncio.gather(*takers), 30)
        assert order == [0, 1, 2, 3] and await gate.held("a.test") == 0
    finally:
        await gate.close()


async def test_a_cancelled_acquire_leaks_no_slot(backend: Backend, clock: FakeClock) -> None:
    gate = open_gate(backend.url, prefix=backend.prefix, rules=RULES, clock=clock)
    try:
        held = await gate.acquire_many("a.test", 2)
        gone = asyncio.create_task(gate.acquire("a.test"))
        kept = asyncio.create_task(gate.acquire("a.test"))
        await asyncio.sleep(0.05)
        gone.cancel()
        await gate.release(held[0])
        slot = await asyncio.wait_for(kept, 30)
        await gate.release(held[1])
        await gate.release(slot)
        assert await gate.held("a.test") == 0
    finally:
        await gate.close()


async def test_closing_the_gate_cancels_waiting_acquires(backend: Backend, clock: FakeClock
                                                          ) -> None:
    gate = open_gate(backend.url, prefix=backend.prefix, rules=RULES, clock=clock)
    await gate.acquire_many("a.test", 2)
    waiter = asyncio.create_task(gate.acquire("a.test"))
    # waiting for its turn (on a loaded machine 50 ms may not see it start)
    await wait_for(lambda: "a.test" in gate._wanted, "the acquire waiting", timeout=30)
    await gate.close()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_reset_frees_every_slot_and_backoff_at_once(
        backend: Backend, gate: DomainGate, store: GateStore, clock: FakeClock) -> None:
    await gate.acquire_many("a.test", 2)
    await gate.release(await gate.acquire("b.test"), 429, retry_after=300)
    await gate.reset()
    assert await gate.held("a.test") == 0
    assert len((await store.acquire("a.test", 2, clock(), RULES, "x")).ids) == 2
    assert (await store.acquire("b.test", 1, clock(), RULES, "y")).ids == ["y:0"]


async def test_reset_ends_robots_fetch_claims_and_keeps_the_files_cached(
        store: GateStore, clock: FakeClock) -> None:
    from crawlhub.agents.politeness import RobotsEntry

    now = clock()
    # a killed crawl's claim to fetch a robots.txt, and a file another run cached
    assert await store.robots_claim("http://a.test", now, now + 3600)
    await store.robots_put("http://b.test", RobotsEntry(200, b"User-agent: *\n", now + 3600),
                           now)
    await store.reset()
    assert await store.robots_claim("http://a.test", now, now + 30)
    assert await store.robots_get("http://a.test") is None
    assert await store.robots_get("http://b.test") == RobotsEntry(200, b"User-agent: *\n",
                                                                  now + 3600)


async def test_extend_moves_held_slots_and_never_brings_back_an_expired_one(
        store: GateStore, clock: FakeClock) -> None:
    now = clock()
    [kept] = (await store.acquire("a.test", 1, now, RULES, "k")).ids
    [lost] = (await store.acquire("b.test", 1, now, RULES, "l")).ids
    later = now + 60  # both leases end now
    assert await store.extend([("a.test", kept, later + 60)], now + 59) == 1
    assert await store.extend([("b.test", lost, later + 60)], later) == 0
    assert await store.held("a.test", later + 30) == 1
    assert await store.held("b.test", later) == 0


async def test_a_gate_renews_the_slots_it_holds_so_a_long_request_keeps_its_slot(
        backend: Backend, clock: FakeClock) -> None:
    steps: asyncio.Queue[None] = asyncio.Queue()
    naps: list[float] = []

    async def renew_sleep(seconds: float) -> None:
        naps.append(seconds)
        await steps.get()

    gate = DomainGate(open_gate_store(backend.url, prefix=backend.prefix), rules=RULES,
                      clock=clock, sleep=clock.sleep, renew_sleep=renew_sleep)
    try:
        start = clock()
        slots = await gate.acquire_many("a.test", 2)
        await gate.release(slots[1])
        clock.advance(50)
        steps.put_nowait(None)  # the renewer wakes: the held slot now lasts to start + 110
        renewed: bool = await wait_for(lambda: _held_at(gate, start + 70), "the renewal")
        assert renewed
        assert naps[0] == pytest.approx(20)  # a third of the lease
        assert await gate.renew() == 1  # the released slot is not renewed
        await gate.release(slots[0])
        assert await gate.renew() == 0
    finally:
        await gate.close()


async def _held_at(gate: DomainGate, when: float) -> bool:
    return await gate.store.held("a.test", when) == 1


async def test_a_domain_with_thousands_of_slots_grants_them_in_one_trip(
        store: GateStore, clock: FakeClock) -> None:
    wide = DomainRules(concurrency=20_000)
    grant = await store.acquire("wide.test", 20_000, clock(), wide, "w")
    assert len(grant.ids) == 20_000 and await store.held("wide.test", clock()) == 20_000

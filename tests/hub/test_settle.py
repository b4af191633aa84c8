"""Settling results and leasing lost tasks in the hub state, on SQLite and real Redis: a
settle is one atomic compare-and-replace of a ledger entry with its counters; a claimed
entry stays in the ledger under a lease until it is settled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.hub.state import HubState, LedgerEntry, RedisHubState, Settle, SqliteHubState
from tests.hub.conftest import delete_prefix


@pytest.fixture(params=["sqlite", "redis"])
async def pair(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
               ) -> AsyncIterator[tuple[HubState, HubState]]:
    """Two state handles on one backend, as two hub processes would hold them."""
    states: tuple[HubState, HubState]
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/hub.db"
        states = (SqliteHubState(url), SqliteHubState(url))
    else:
        url = request.getfixturevalue("redis_url")
        states = (RedisHubState(url, prefix=f"{unique_name}:"),
                  RedisHubState(url, prefix=f"{unique_name}:"))
    yield states
    for st in states:
        await st.close()
    if request.param == "redis":
        await delete_prefix(request.getfixturevalue("redis_url"), f"{unique_name}:")


def entry(uuid: str, deadline: float | None = None, outbound: str = "o",
          routed: int = 1) -> LedgerEntry:
    return LedgerEntry({"task_uuid": uuid, "routed_count": routed}, outbound, deadline)


async def read(state: HubState, uuid: str) -> LedgerEntry:
    got = await state.get(uuid)
    assert got is not None
    return got


async def test_settle_replaces_the_entry_and_moves_counters_in_one_step(
        pair: tuple[HubState, HubState]) -> None:
    state, _ = pair
    await state.record([entry("a")])
    current = await read(state, "a")
    nxt = LedgerEntry({"task_uuid": "a", "routed_count": 2}, "b", None, pending="push")
    assert await state.settle(current, nxt, [("o", "retried", 1), ("b", "total", 1)],
                              lease_until=time.time() + 60)
    stored = await read(state, "a")
    assert stored.task["routed_count"] == 2 and stored.outbound == "b"
    assert (await state.counters()) == {"o": {"retried": 1}, "b": {"total": 1}}


async def test_settle_of_an_entry_that_changed_meanwhile_does_nothing(
        pair: tuple[HubState, HubState]) -> None:
    first, second = pair
    await first.record([entry("a")])
    seen_by_first = await read(first, "a")
    seen_by_second = await read(second, "a")
    assert await second.settle(seen_by_second, None, [("o", "success", 1)])
    assert not await first.settle(seen_by_first, None, [("o", "success", 1)])
    assert await first.get("a") is None
    assert (await first.counters()) == {"o": {"success": 1}}


async def test_get_many_reads_the_entries_that_exist_in_one_call(
        pair: tuple[HubState, HubState]) -> None:
    state, _ = pair
    await state.record([entry(f"t{i}") for i in range(600)])  # past SQLite's 500 per IN
    got = await state.get_many([f"t{i}" for i in range(600)] + ["missing", "t1"])
    assert sorted(got) == sorted(f"t{i}" for i in range(600))
    assert got["t7"] == await read(state, "t7")
    assert await state.get_many([]) == {}


async def test_settle_many_applies_each_unchanged_entry_and_skips_each_changed_one(
        pair: tuple[HubState, HubState]) -> None:
    first, second = pair
    await first.record([entry(f"t{i}") for i in range(6)])
    seen = await first.get_many([f"t{i}" for i in range(6)])
    # another process settles t1 and t4 first: the batch must skip exactly those
    for uuid in ("t1", "t4"):
        assert await second.settle(await read(second, uuid), None, [("o", "success", 1)])
    retry = LedgerEntry({"task_uuid": "t2", "routed_count": 2}, "b", None, pending="push")
    waiting = LedgerEntry({"task_uuid": "t3", "routed_count": 2}, "b", time.time() + 60)
    done = await first.settle_many([
        Settle(seen["t0"], None, [("o", "success", 1)]),
        Settle(seen["t1"], None, [("o", "success", 1)]),
        Settle(seen["t2"], retry, [("o", "retried", 1), ("b", "total", 1)],
               lease_until=time.time() + 60),
        Settle(seen["t3"], waiting, [("o", "failback", 1), ("b", "total", 1)]),
        Settle(seen["t4"], None, [("o", "failed", 1)]),
        Settle(seen["t5"], None, [("o", "success", 1)]),
    ])
    assert done == [True, False, True, True, False, True]
    left = await first.get_many([f"t{i}" for i in range(6)])
    assert sorted(left) == ["t2", "t3"]
    assert left["t2"].outbound == "b" and left["t2"].task["routed_count"] == 2
    assert retry.raw is not None and waiting.raw is not None  # settle-able again
    assert await first.settle(left["t3"], None, [("b", "success", 1)])
    # the counters of the two skipped items were not added
    assert (await first.counters()) == {"o": {"success": 4, "retried": 1, "failback": 1},
                                         "b": {"total": 2, "success": 1}}
    assert await first.settle_many([]) == []


async def test_two_processes_settling_one_result_at_once_settle_it_once(
        pair: tuple[HubState, HubState]) -> None:
    first, second = pair
    await first.record([entry(f"t{i}") for i in range(20)])
    seen = [(await read(first, f"t{i}"), await read(second, f"t{i}")) for i in range(20)]
    outcomes = await asyncio.gather(*(
        st.settle(e, None, [("o", "success", 1)])
        for a, b in seen for st, e in ((first, a), (second, b))))
    assert sum(outcomes) == 20
    assert (await first.counters())["o"]["success"] == 20


async def test_a_claimed_lost_entry_stays_in_the_ledger_under_a_lease(
        pair: tuple[HubState, HubState]) -> None:
    state, _ = pair
    now = time.time()
    await state.record([entry("lost", now - 1)])
    [claimed] = await state.claim_expired(now, lease=30)
    assert claimed.pending == "timeout"
    assert await state.get("lost") is not None  # not deleted before it is handled
    assert await state.pending() == 1
    assert await state.claim_expired(now + 29, lease=30) == []
    # Its claimer died before settling it: once the lease ends, the next sweep has it.
    [again] = await state.claim_expired(now + 31, lease=30)
    assert again.task["task_uuid"] == "lost" and again.pending == "timeout"
    assert await state.settle(again, None, [("o", "timeout", 1)])
    assert await state.claim_expired(now + 3600) == [] and await state.pending() == 0


async def test_two_processes_sweeping_at_once_claim_each_lost_entry_once(
        pair: tuple[HubState, HubState]) -> None:
    first, second = pair
    now = time.time()
    await first.record([entry(f"t{i}", now - 1) for i in range(50)])
    one, two = await asyncio.gather(first.claim_expired(now, limit=30),
                                    second.claim_expired(now, limit=30))
    more = await first.claim_expired(now) + await second.claim_expired(now)
    uuids = [e.task["task_uuid"] for e in one + two + more]
    assert sorted(uuids) == sorted(f"t{i}" for i in range(50))


async def test_a_follow_up_left_unfinished_is_claimed_with_what_is_left_to_do(
        pair: tuple[HubState, HubState]) -> None:
    state, other = pair
    now = time.time()
    await state.record([entry("r"), entry("f")])
    push = LedgerEntry({"task_uuid": "r", "routed_count": 2}, "o", now + 600, pending="push")
    fail = LedgerEntry({"task_uuid": "f", "routed_count": 1}, "o", None, pending="fail",
                       failure={"task_result": 500, "reason": "no retries left"})
    assert await state.settle(await read(state, "r"), push, lease_until=now + 30)
    assert await state.settle(await read(state, "f"), fail, lease_until=now + 30)
    # The settling process is killed here; another one's sweep finds both after the lease.
    assert await other.claim_expired(now + 10) == []
    found = {e.task["task_uuid"]: e for e in await other.claim_expired(now + 31)}
    assert found["r"].pending == "push" and found["r"].task["routed_count"] == 2
    assert found["f"].pending == "fail" and found["f"].failure == {
        "task_result": 500, "reason": "no retries left"}
    # Released after the push: it waits for its result (and its deadline) again.
    waiting = LedgerEntry(found["r"].task, "o", found["r"].deadline, raw=found["r"].raw)
    assert await other.settle(found["r"], waiting)
    assert await other.settle(found["f"], None)
    assert await other.claim_expired(now + 100) == []
    [late] = await other.claim_expired(now + 601)
    assert late.task["task_uuid"] == "r" and late.pending == "timeout"


async def test_end_leases_hands_a_dead_processs_follow_ups_to_the_next_claim_at_once(
        pair: tuple[HubState, HubState]) -> None:
    state, other = pair
    now = time.time()
    await state.record([entry("r"), entry("w")])
    push = LedgerEntry({"task_uuid": "r", "routed_count": 2}, "o", None, pending="push")
    assert await state.settle(await read(state, "r"), push, lease_until=now + 30)
    # killed here; the next run knows it is dead (crawlhub crawl's lock) and takes over
    assert await other.claim_expired(now) == []
    assert await other.end_leases(now) == 1
    [found] = await other.claim_expired(now)
    assert found.task["task_uuid"] == "r" and found.pending == "push"
    # the claim leases it anew; an entry waiting for its result has no lease to end
    assert await other.end_leases(now) == 1
    assert await other.end_leases(now) == 0
    assert (await read(other, "w")).pending is None


async def test_dispatch_counts_are_shared_per_second(
        pair: tuple[HubState, HubState]) -> None:
    first, second = pair
    await first.note_dispatched([("o", 100, 3), ("p", 100, 1)])
    await second.note_dispatched([("o", 101, 2), ("o", 90, 7)])
    assert await first.dispatched_in(91, 101) == {"o": 5, "p": 1}
    assert await second.dispatched_in(101, 101) == {"o": 2}


async def test_a_settled_task_is_no_longer_pushed_again_by_intake_recovery(
        pair: tuple[HubState, HubState]) -> None:
    from crawlhub.hub.state.intake import Intake

    state, _ = pair
    now = time.time()
    task = {"task_uuid": "u", "routed_count": 1}
    # Recorded and pushed, and its result (a retry) came before the push was marked done.
    assert await state.intake_begin([Intake(task, "o", None)], now, "hub-a") == ["N"]
    retry = LedgerEntry({"task_uuid": "u", "routed_count": 2}, "o", None, pending="push")
    assert await state.settle(await read(state, "u"), retry, [("o", "retried", 1)],
                              lease_until=now + 30)
    assert await state.intake_claim(now + 3600, now + 3600, "hub-b") == []

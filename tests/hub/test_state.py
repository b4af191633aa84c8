"""Hub state conformance: ledger, counters and token buckets behave the same on SQLite
and on real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.hub.state import HubState, LedgerEntry, RedisHubState, SqliteHubState
from tests.helpers import FakeClock
from tests.hub.conftest import delete_prefix


@pytest.fixture(params=["sqlite", "redis"])
async def state(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str,
                clock: FakeClock) -> AsyncIterator[HubState]:
    st: HubState
    if request.param == "sqlite":
        st = SqliteHubState(f"sqlite:///{tmp_path}/hub.db", clock=clock)
    else:
        st = RedisHubState(request.getfixturevalue("redis_url"), prefix=f"{unique_name}:",
                           clock=clock)
    yield st
    await st.close()
    if request.param == "redis":
        await delete_prefix(request.getfixturevalue("redis_url"), f"{unique_name}:")


def entry(uuid: str, deadline: float | None = None, outbound: str = "o") -> LedgerEntry:
    return LedgerEntry({"task_uuid": uuid, "url": f"http://x/{uuid}"}, outbound, deadline)


async def test_recorded_entry_can_be_read_and_resolved_once(state: HubState) -> None:
    await state.record([entry("a"), entry("b")])
    got = await state.get("a")
    assert got is not None and got.task["url"] == "http://x/a" and got.outbound == "o"
    assert await state.pending() == 2
    resolved = await state.resolve("a")
    assert resolved is not None and resolved.task["task_uuid"] == "a"
    assert await state.resolve("a") is None
    assert await state.get("a") is None
    assert await state.pending() == 1


async def test_unknown_uuid_resolves_to_none(state: HubState) -> None:
    assert await state.resolve("nope") is None


async def test_claim_expired_takes_only_past_deadlines_once(state: HubState, clock: FakeClock
                                                             ) -> None:
    now = clock()
    await state.record([entry("late", now - 1), entry("soon", now + 3600), entry("never")])
    claimed = await state.claim_expired(now)
    assert [e.task["task_uuid"] for e in claimed] == ["late"]
    assert await state.claim_expired(now) == []
    assert await state.settle(claimed[0], None)  # handled: its lease ends with it
    assert {e.task["task_uuid"] for e in await state.claim_expired(now + 7200)} == {"soon"}
    assert await state.get("never") is not None


async def test_counters_add_up_per_outbound(state: HubState) -> None:
    await state.incr("a", "total", 3)
    await state.incr_many([("a", "total", 2), ("a", "success", 1), ("b", "failed", 4)])
    counters = await state.counters()
    assert counters["a"] == {"total": 5, "success": 1}
    assert counters["b"] == {"failed": 4}


async def test_token_bucket_grants_burst_then_asks_to_wait(state: HubState, clock: FakeClock
                                                            ) -> None:
    assert await state.take_tokens("scope", 2.0, 2, 2.0) == 0
    assert await state.take_tokens("scope", 2.0, 1, 2.0) == pytest.approx(0.5)
    clock.advance(0.25)
    assert await state.take_tokens("scope", 2.0, 1, 2.0) == pytest.approx(0.25)
    clock.advance(0.25)
    assert await state.take_tokens("scope", 2.0, 1, 2.0) == 0
    clock.advance(3600)  # a long pause refills the bucket only up to its burst
    assert await state.take_tokens("scope", 2.0, 2, 2.0) == 0
    assert await state.take_tokens("scope", 2.0, 1, 2.0) > 0


async def test_token_buckets_are_separate_per_scope(state: HubState) -> None:
    assert await state.take_tokens("one", 1.0, 1, 1.0) == 0
    assert await state.take_tokens("two", 1.0, 1, 1.0) == 0
    assert await state.take_tokens("one", 1.0, 1, 1.0) > 0


async def test_redis_state_is_shared_between_processes(redis_url: str, unique_name: str
                                                       ) -> None:
    first = RedisHubState(redis_url, prefix=f"{unique_name}:")
    second = RedisHubState(redis_url, prefix=f"{unique_name}:")
    try:
        await first.record([entry("shared")])
        assert await second.resolve("shared") is not None
        assert await first.resolve("shared") is None
        assert await first.take_tokens("s", 1.0, 1, 1.0) == 0
        assert await second.take_tokens("s", 1.0, 1, 1.0) > 0
    finally:
        await first.close()
        await second.close()
        await delete_prefix(redis_url, f"{unique_name}:")

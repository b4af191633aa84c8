"""Intake that loses and doubles nothing: a task is recorded before it is pushed and
marked pushed after, so a failed push is undone (the retry is pushed, its URL admitted
again), a process killed in between is recovered, and a task_uuid already routed is not
pushed twice, on SQLite and Redis, across hub instances."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import redis

from crawlhub.app.asgi import create_app
from crawlhub.core.errors import BackendUnavailable
from crawlhub.hub.hub import Hub
from crawlhub.hub.intake import ALIVE_TTL, _PartlyPushed
from tests.helpers import FakeClock
from tests.hub.conftest import Throwaway
from tests.servers import free_port

Opener = Callable[[Any], Any]


class Crash(BaseException):
    """Stands for a SIGKILL: no ``except Exception`` of the hub runs after it."""


async def drain(svc: Any, name: str) -> list[dict[str, Any]]:
    queue = svc.queues.queue(name)
    messages = await queue.lease(1000, 60)
    await queue.ack([m.id for m in messages])
    return [m.payload for m in messages]


def client_of(svc: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(services=svc)),
                             base_url="http://hub")


# ------------------------------------------------------------------ failed pushes
async def test_frontier_gated_post_is_503_while_its_redis_is_down_then_routed(
        make_config: Callable[..., Any], open_services: Opener,
        throwaway: Throwaway) -> None:
    svc = await open_services(make_config(
        frontier={"web": {}},
        outbound=[{"name": "pages", "class": "redis_list", "frontier": "web",
                   "init": {"url": throwaway.url, "key": "pages"}}]))
    task = {"url": "http://example.com/a"}
    async with client_of(svc) as client:
        throwaway.stop()
        down = await client.post("/task/", json=task)
        assert down.status_code == 503, down.text
        assert "Retry-After" in down.headers
        throwaway.start()
        again = await client.post("/task/", json=task)
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "routed"
        # The URL is admitted once: a third post is the duplicate, not a second push.
        third = await client.post("/task/", json=task)
        assert third.json()["status"] == "duplicate"
    [pushed] = throwaway.list("pages")
    assert b"http://example.com/a" in pushed
    assert await svc.state.pending() == 1


async def test_a_batch_split_over_two_outbounds_answers_per_task_when_one_is_down(
        make_config: Callable[..., Any], open_services: Opener,
        throwaway: Throwaway) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "ok", "selector": ["k == 1"]},
        {"name": "far", "class": "redis_list", "selector": ["k == 2"],
         "init": {"url": throwaway.url, "key": "far"}}]))
    batch = [{"k": 1, "task_uuid": "u-ok"}, {"k": 2, "task_uuid": "u-far"}]
    async with client_of(svc) as client:
        throwaway.stop()
        first = await client.post("/task/", json=batch)
        # Not a 5xx over a pushed task: 207, and what happened to each.
        assert first.status_code == 207, first.text
        assert [t["status"] for t in first.json()["tasks"]] == ["routed", "unavailable"]
        throwaway.start()
        retry = await client.post("/task/", json=batch)
        assert retry.status_code == 200, retry.text
        assert [t["status"] for t in retry.json()["tasks"]] == ["already_routed", "routed"]
    assert [p["task_uuid"] for p in await drain(svc, "ok")] == ["u-ok"]
    assert len(throwaway.list("far")) == 1


async def test_nothing_pushed_is_backend_unavailable(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "far", "class": "redis_list",
         "init": {"url": f"redis://127.0.0.1:{free_port()}/0", "key": "far"}}]))
    with pytest.raises(BackendUnavailable):
        await svc.hub.submit([{"n": 1}, {"n": 2}])
    assert await svc.state.pending() == 0


# ------------------------------------------------------------------ a kill in between
async def crash_after_admission(svc: Any, task: dict[str, Any]) -> None:
    """Submit ``task`` and die right after the frontier admitted it, before any push."""
    hub: Hub = svc.hub

    async def die(*args: Any, **kwargs: Any) -> Any:
        raise Crash

    hub._push_recorded = die  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await hub.submit([task])


async def test_a_url_admitted_by_a_hub_killed_before_its_push_is_pushed_by_recovery(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    config = make_config(frontier={"web": {}},
                         outbound=[{"name": "pages", "frontier": "web"}])
    killed = await open_services(config)
    await crash_after_admission(killed, {"url": "http://example.com/a", "task_uuid": "first"})
    await killed.close()

    svc = await open_services(config)
    # The client's retry of the URL: already admitted, and in flight, so a duplicate;
    # nothing is pushed twice.
    [retry] = await svc.hub.submit([{"url": "http://example.com/a"}])
    assert retry.status == "duplicate"
    assert await svc.queues.queue("pages").length() == 0
    # Recovery (every hub runs it) pushes the abandoned task once its hub is silent.
    assert await svc.hub.recover_intake(time.time()) == 0
    assert await svc.hub.recover_intake(time.time() + ALIVE_TTL + 1) == 1
    assert [p["task_uuid"] for p in await drain(svc, "pages")] == ["first"]
    assert await svc.hub.recover_intake(time.time() + 2 * ALIVE_TTL + 2) == 0
    [later] = await svc.hub.submit([{"url": "http://example.com/a"}])
    assert later.status == "duplicate"


async def test_a_url_of_a_dead_hub_stays_a_duplicate_until_recovery_pushes_it(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    config = make_config(frontier={"web": {}},
                         outbound=[{"name": "pages", "frontier": "web"}])
    killed = await open_services(config)
    await crash_after_admission(killed, {"url": "http://example.com/a", "task_uuid": "first"})
    await killed.close()

    svc = await open_services(config)
    later = time.time() + ALIVE_TTL + 1  # the killed hub has stopped beating by then
    svc.hub.clock = lambda: later
    [retry] = await svc.hub.submit([{"url": "http://example.com/a", "task_uuid": "second"}])
    assert retry.status == "duplicate"
    assert await svc.hub.recover_intake(later) == 1
    assert [p["task_uuid"] for p in await drain(svc, "pages")] == ["first"]


async def test_a_task_killed_after_its_record_is_pushed_by_recovery_once(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    config = make_config(frontier={"web": {}}, outbound=[{"name": "o", "frontier": "web"}])
    killed = await open_services(config)
    await crash_after_admission(killed, {"url": "http://x/1", "task_uuid": "u1"})
    await killed.close()
    svc = await open_services(config)
    # The same uuid sent again: already routed (recovery pushes it).
    [again] = await svc.hub.submit([{"url": "http://x/1", "task_uuid": "u1"}])
    assert again.status == "already_routed"
    await svc.hub.recover_intake(time.time() + ALIVE_TTL + 1)
    assert [p["task_uuid"] for p in await drain(svc, "o")] == ["u1"]


async def test_intake_records_and_recovery_follow_the_hubs_clock(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    # crawlhub.core.clock: the intake's records and heartbeats are leases on the hub's clock,
    # so a fake clock alone decides when a killed hub's record is recovered.
    clock = FakeClock(start=time.time() + 10 * 24 * 3600)
    config = make_config(frontier={"web": {}}, outbound=[{"name": "o", "frontier": "web"}])
    killed = await open_services(config)
    killed.hub.clock = clock
    await crash_after_admission(killed, {"url": "http://x/1", "task_uuid": "u1"})
    await killed.close()
    svc = await open_services(config)
    svc.hub.clock = clock
    assert await svc.hub.recover_intake() == 0
    clock.advance(ALIVE_TTL + 1)
    assert await svc.hub.recover_intake() == 1
    assert [p["task_uuid"] for p in await drain(svc, "o")] == ["u1"]


# ------------------------------------------------------------------ idempotent uuids
async def test_a_task_uuid_routed_and_unresolved_is_not_pushed_again(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    [first] = await svc.hub.submit([{"n": 1, "task_uuid": "same"}])
    results = await svc.hub.submit([{"n": 1, "task_uuid": "same"},
                                    {"n": 2, "task_uuid": "other"},
                                    {"n": 2, "task_uuid": "other"}])
    assert first.status == "routed"
    assert [r.status for r in results] == ["already_routed", "routed", "already_routed"]
    assert "task_uuid" in (results[0].reason or "")
    assert sorted(p["task_uuid"] for p in await drain(svc, "o")) == ["other", "same"]
    counters = await svc.state.counters()
    assert counters["o"]["total"] == 2


async def test_a_task_uuid_is_remembered_until_its_result_settles_it(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(routing={"terminal_codes": [1000]},
                                          outbound=[{"name": "o"}]))
    await svc.hub.submit([{"n": 1, "task_uuid": "u"}])
    [payload] = await drain(svc, "o")
    [outcome] = await svc.hub.receive("http", [{**payload, "task_result": 1000}])
    assert outcome["status"] == "success"
    # Resolved: the uuid is free again, and a new task with it is routed.
    [again] = await svc.hub.submit([{"n": 1, "task_uuid": "u"}])
    assert again.status == "routed"


async def test_two_hubs_sharing_the_state_push_a_task_uuid_once(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    config = make_config(frontier={"web": {}},
                         outbound=[{"name": "gated", "selector": ["url"], "frontier": "web"},
                                   {"name": "plain"}])
    one, two = await open_services(config), await open_services(config)
    tasks = [{"n": 1, "task_uuid": "p"}, {"url": "http://x/1", "task_uuid": "g"}]
    assert [r.status for r in await one.hub.submit(tasks)] == ["routed", "routed"]
    assert [r.status for r in await two.hub.submit(tasks)] == ["already_routed"] * 2
    # A different uuid for the same URL is the frontier's duplicate, not a second push.
    [dup] = await two.hub.submit([{"url": "http://x/1", "task_uuid": "g2"}])
    assert dup.status == "duplicate"
    assert [p["task_uuid"] for p in await drain(one, "plain")] == ["p"]
    assert [p["task_uuid"] for p in await drain(one, "gated")] == ["g"]


async def test_already_routed_over_the_api(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    async with client_of(svc) as client:
        first = await client.post("/task/", json={"task_uuid": "x", "n": 1})
        second = await client.post("/task/", json={"task_uuid": "x", "n": 1})
    assert first.json()["status"] == "routed"
    assert second.status_code == 200
    assert second.json()["status"] == "already_routed"
    assert len(await drain(svc, "o")) == 1


async def test_two_outbounds_on_one_queue_both_push_their_tasks(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "a", "selector": ["k == 1"], "init": {"key": "shared"}},
        {"name": "b", "selector": ["k == 2"], "init": {"key": "shared"}}]))
    results = await svc.hub.submit([{"k": 1}, {"k": 2}])
    assert [(r.status, r.outbound) for r in results] == [("routed", "a"), ("routed", "b")]
    assert sorted(p["k"] for p in await drain(svc, "shared")) == [1, 2]


async def test_an_inbound_source_waits_an_outage_out_and_pushes_once(
        make_config: Callable[..., Any], open_services: Opener,
        throwaway: Throwaway) -> None:
    import asyncio

    svc = await open_services(make_config(outbound=[
        {"name": "far", "class": "redis_list", "init": {"url": throwaway.url, "key": "far"}}]))
    throwaway.stop()
    submitting = asyncio.create_task(svc.hub.submit([{"n": 1}], wait=True))
    await asyncio.sleep(0.3)
    assert not submitting.done()
    throwaway.start()
    [result] = await asyncio.wait_for(submitting, 30)
    assert result.status == "routed"
    assert len(throwaway.list("far")) == 1


async def test_a_duplicate_killed_before_its_record_went_is_not_pushed_by_recovery(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    config = make_config(frontier={"web": {}},
                         outbound=[{"name": "pages", "frontier": "web"}])
    killed = await open_services(config)
    [first] = await killed.hub.submit([{"url": "http://x/1", "task_uuid": "first"}])
    assert first.status == "routed"

    async def die(*args: Any, **kwargs: Any) -> Any:
        raise Crash

    async def unknown(todo: Any, *args: Any) -> Any:
        return todo  # as if the frontier's read had failed: the general path records it

    killed.hub._known = unknown  # type: ignore[method-assign]
    killed.hub._abort = die  # type: ignore[method-assign]
    with pytest.raises(Crash):  # found a duplicate, killed before its record went
        await killed.hub.submit([{"url": "http://x/1", "task_uuid": "second"}])
    await killed.close()

    svc = await open_services(config)
    assert await svc.hub.recover_intake(time.time() + ALIVE_TTL + 1) == 0
    assert [p["task_uuid"] for p in await drain(svc, "pages")] == ["first"]
    assert await svc.hub.recover_intake(time.time() + 2 * ALIVE_TTL + 2) == 0


async def test_a_url_the_frontier_admitted_is_answered_duplicate_without_a_record(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    config = make_config(frontier={"web": {}},
                         outbound=[{"name": "pages", "frontier": "web"}])
    svc = await open_services(config)
    [first] = await svc.hub.submit([{"url": "http://x/1", "task_uuid": "first"}])
    assert first.status == "routed"
    begun: list[int] = []
    begin = svc.hub.state.intake_begin

    async def counting(items: Any, *args: Any) -> Any:
        begun.append(len(items))
        return await begin(items, *args)

    svc.hub.state.intake_begin = counting  # type: ignore[method-assign]
    answers = await svc.hub.submit([{"url": "http://x/1"}, {"url": "http://x/1#top"},
                                    {"url": "http://x/2"}])
    assert [a.status for a in answers] == ["duplicate", "duplicate", "routed"]
    assert begun == [1]  # only the new URL was recorded
    assert await svc.hub.state.get_many([a.task_uuid or "" for a in answers[:2]]) == {}
    [stats] = await svc.frontiers["web"].stats()
    assert stats["duplicates"] == 2
    # the first task, resolved, is still what the ledger holds for its uuid (a client
    # repeating it is answered already_routed, not duplicate)
    [again] = await svc.hub.submit([{"url": "http://x/1", "task_uuid": "first"}])
    assert again.status == "already_routed"


async def test_a_url_released_untaken_is_taken_over_not_answered_duplicate(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    config = make_config(frontier={"web": {}},
                         outbound=[{"name": "pages", "frontier": "web"}])
    svc = await open_services(config)
    send, fused = svc.hub._send, svc.hub._push_fused

    async def fail(ready: Any, **kwargs: Any) -> Any:
        return [Crash()] * len(ready)

    async def fail_fused(mode: str, todo: Any, now: float) -> Any:
        raise _PartlyPushed(Crash(), [False] * len(todo), {})

    svc.hub._send = fail  # type: ignore[method-assign]
    svc.hub._push_fused = fail_fused  # type: ignore[method-assign]
    with pytest.raises(Crash):  # admitted by the frontier, its push failed
        await svc.hub.submit([{"url": "http://x/1"}])
    svc.hub._send, svc.hub._push_fused = send, fused  # type: ignore[method-assign]
    [second] = await svc.hub.submit([{"url": "http://x/1"}])
    assert second.status == "routed"
    assert [p["url"] for p in await drain(svc, "pages")] == ["http://x/1"]


async def test_an_outbound_delivery_limit_is_stored_with_its_queue_by_intake(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    from crawlhub.queues import open_backend

    config = make_config(outbound=[{"name": "o", "init": {"max_attempts": 3}}])
    svc = await open_services(config)
    await svc.hub.submit([{"n": 1}])
    # A worker's process that does not know the outbound's config sees the limit.
    backend = open_backend(config.storage.queues.replace("{data_dir}", str(config.data_dir)),
                           prefix=config.storage.redis_prefix)
    try:
        assert (await backend.queue("o").stats()).max_attempts == 3
    finally:
        await backend.close()


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "frontier"])
async def test_a_hub_killed_after_a_push_and_before_marking_it_is_not_pushed_twice(
        make_config: Callable[..., Any], open_services: Opener, gated: bool) -> None:
    outbound: dict[str, Any] = {"name": "o", **({"frontier": "web"} if gated else {})}
    config = make_config(frontier={"web": {}}, outbound=[outbound])
    killed = await open_services(config)
    state: Any = killed.hub.state

    async def die(*args: Any, **kwargs: Any) -> Any:
        raise Crash

    state.intake_commit = die  # (on Redis the push marks itself: nothing to kill there)
    try:
        await killed.hub.submit([{"url": "http://x/1", "task_uuid": "u1"}])
    except Crash:
        pass
    await killed.close()

    svc = await open_services(config)
    [again] = await svc.hub.submit([{"url": "http://x/1", "task_uuid": "u1"}])
    assert again.status == "already_routed"
    await svc.hub.recover_intake(time.time() + ALIVE_TTL + 1)
    assert [p["task_uuid"] for p in await drain(svc, "o")] == ["u1"]
    assert await svc.hub.recover_intake(time.time() + 2 * ALIVE_TTL + 2) == 0
    assert (await svc.state.counters())["o"]["total"] == 1


async def test_a_long_batch_pushes_each_task_once_across_its_scripts(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    from crawlhub.hub.intake import FUSED_CHUNK

    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    n = 2 * FUSED_CHUNK + 10
    tasks = [{"n": i, "task_uuid": f"u{i}"} for i in range(n)]
    tasks[-1]["task_uuid"] = "u3"  # the same uuid as a task in the first script
    results = await svc.hub.submit(tasks)
    assert [r.status for r in results] == ["routed"] * (n - 1) + ["already_routed"]
    assert sorted(p["n"] for p in await drain(svc, "o")) == list(range(n - 1))


async def test_a_long_batch_with_a_too_deep_task_at_its_end_writes_nothing(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    """A plain batch is routed and sent chunk by chunk, but every task's depth is seen
    before the first chunk goes: a too-deep task at the end refuses the whole batch."""
    from crawlhub.core.jsoncodec import MAX_DEPTH, TooDeepError
    from crawlhub.hub.intake import STREAM_CHUNK

    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    deep: Any = "x"
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    tasks = [{"n": i} for i in range(3 * STREAM_CHUNK)] + [{"n": -1, "deep": deep}]
    with pytest.raises(TooDeepError):
        await svc.hub.submit(tasks)
    assert await svc.queues.queue("o").length() == 0
    assert await svc.state.pending() == 0


async def test_a_long_batch_for_an_outbound_at_max_lag_writes_nothing_for_any_outbound(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    """Not streamed when an outbound has a max_lag: the tasks for another outbound at the
    head of the batch are not pushed before backpressure refuses the batch."""
    from crawlhub.core.errors import BackpressureError
    from crawlhub.hub.intake import STREAM_CHUNK

    svc = await open_services(make_config(outbound=[
        {"name": "full", "selector": ["k == 'full'"], "max_lag": 1},
        {"name": "free"}]))
    await svc.hub.submit([{"k": "full"}])
    with pytest.raises(BackpressureError):
        await svc.hub.submit([{"k": "free"}] * (3 * STREAM_CHUNK) + [{"k": "full"}])
    assert await svc.queues.queue("free").length() == 0
    assert await svc.queues.queue("full").length() == 1


async def test_tasks_that_cannot_be_stored_in_a_later_chunk_are_refused_alone(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    """Hostile tasks deep in a streamed batch (a NaN, an infinity, a lone surrogate) are
    refused alone, like at its head; every other task of every chunk is routed once."""
    import math

    from crawlhub.hub.intake import STREAM_CHUNK

    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    n = 3 * STREAM_CHUNK
    tasks: list[dict[str, Any]] = [{"n": i} for i in range(n)]
    bad = {n - 1: {"n": math.nan}, n - 3: {"n": {"in": [math.inf]}},
           2 * STREAM_CHUNK + 1: {"n": "\ud800"}}
    for i, task in bad.items():
        tasks[i] = task
    results = await svc.hub.submit(tasks)
    for i, result in enumerate(results):
        assert result.status == ("rejected" if i in bad else "routed"), (i, result)
    assert all("cannot be stored" in (results[i].reason or "") for i in bad)
    # counted as every refusal is, on the one-script push too (it was not, before)
    assert svc.hub.metrics.registry.get_sample_value("crawlhub_tasks_rejected_total") == 3
    assert sorted(p["n"] for p in await drain(svc, "o")) == \
        sorted(i for i in range(n) if i not in bad)


async def test_a_task_no_store_can_hold_is_refused_alone_on_the_general_path(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    """Behind a frontier (record, admit, push): a task holding a lone surrogate is refused
    alone, the others routed; before, the whole batch raised UnicodeEncodeError from the
    ledger's write (an in-process caller's batch; the HTTP API refuses such a body)."""
    svc = await open_services(make_config(frontier={"web": {}},
                                          outbound=[{"name": "pages", "frontier": "web"}]))
    results = await svc.hub.submit([{"url": "http://x/1"}, {"url": "http://x/2", "t": "\ud800"},
                                    {"url": "http://x/3"}])
    assert [r.status for r in results] == ["routed", "rejected", "routed"]
    assert "cannot be stored" in (results[1].reason or "")
    assert sorted(p["url"] for p in await drain(svc, "pages")) == ["http://x/1", "http://x/3"]
    assert svc.hub.metrics.registry.get_sample_value("crawlhub_tasks_rejected_total") == 1
    # the URL was not admitted for it: the same URL, storable, is routed
    [again] = await svc.hub.submit([{"url": "http://x/2"}])
    assert again.status == "routed"


@pytest.mark.parametrize("backend", ["sqlite"])  # the general path: record, push, mark
async def test_a_long_batch_on_the_general_path_is_recorded_in_one_step_not_per_chunk(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    """Only the one-script push streams: a long batch for a SQLite queue is recorded,
    pushed and marked pushed once (three round trips), not once per chunk."""
    from crawlhub.hub.intake import STREAM_CHUNK

    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    state: Any = svc.hub.state
    begin = state.intake_begin
    sizes: list[int] = []

    async def counted(items: Any, *args: Any) -> Any:
        sizes.append(len(items))
        return await begin(items, *args)

    state.intake_begin = counted
    results = await svc.hub.submit([{"n": i} for i in range(3 * STREAM_CHUNK)])
    assert {r.status for r in results} == {"routed"}
    assert sizes == [3 * STREAM_CHUNK]
    assert await svc.queues.queue("o").length() == 3 * STREAM_CHUNK


@pytest.mark.parametrize("backend", ["redis"])  # the one-script push: the Redis ledger's
@pytest.mark.parametrize("uuids", [True, False], ids=["given-uuids", "drawn-uuids"])
async def test_a_chunk_that_cannot_be_sent_leaves_the_chunks_around_it_routed_and_it_safe_to_retry(
        make_config: Callable[..., Any], open_services: Opener, uuids: bool) -> None:
    """A batch streamed as several pushes whose second cannot be sent: the first and
    later chunks' tasks are routed, the second's answered unavailable with nothing
    kept, and the client's retry of those routes each once. Tasks without a uuid go
    as plain commands in a MULTI (hub/state/intake/ids.py), the others by script."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from crawlhub.hub.intake import STREAM_CHUNK, stream_chunks

    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    state: Any = svc.hub.state
    send = state.intake_push_sent
    n = 3 * STREAM_CHUNK
    sizes = stream_chunks(n)
    assert len(sizes) >= 3
    calls = 0

    async def second_fails(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RedisConnectionError("Connection reset by peer")
        return await send(*args, **kwargs)

    state.intake_push_sent = second_fails
    tasks = [{"n": i, **({"task_uuid": f"u{i}"} if uuids else {})} for i in range(n)]
    results = await svc.hub.submit(tasks)
    statuses = [r.status for r in results]
    # the chunk that could not be sent is unavailable; the chunks around it are routed
    first, second = sizes[:2]
    assert statuses == (["routed"] * first + ["unavailable"] * second
                        + ["routed"] * (n - first - second))
    lost = [t for t, r in zip(tasks, results, strict=True) if r.status == "unavailable"]
    assert all("nothing of it was kept" in (r.reason or "") for r in results
               if r.status == "unavailable")

    def dispatched() -> float | None:  # only the tasks pushed count as dispatched
        return svc.hub.metrics.registry.get_sample_value("crawlhub_tasks_dispatched_total",
                                                         {"outbound": "o"})

    assert dispatched() == n - second
    state.intake_push_sent = send
    again = await svc.hub.submit(lost)
    assert {r.status for r in again} == {"routed"}
    assert dispatched() == n
    assert sorted(p["n"] for p in await drain(svc, "o")) == list(range(n))


async def test_a_push_after_a_script_flush_loads_its_script_and_pushes_once(
        throwaway: Throwaway, open_services: Opener, tmp_path: Path) -> None:
    from crawlhub.config.schema import CrawlhubConfig

    # SCRIPT FLUSH is server-wide: the test's own server, never the shared one
    storage = {"queues": throwaway.url, "state": throwaway.url, "frontier": throwaway.url}
    svc = await open_services(CrawlhubConfig.model_validate(
        {"data_dir": str(tmp_path), "storage": storage, "outbound": [{"name": "o"}]}))
    assert [r.status for r in await svc.hub.submit([{"n": 1}])] == ["routed"]
    redis.Redis.from_url(throwaway.url).script_flush()
    assert [r.status for r in await svc.hub.submit([{"n": 2}, {"n": 3}])] == ["routed"] * 2
    assert sorted(p["n"] for p in await drain(svc, "o")) == [1, 2, 3]


async def test_a_push_whose_mark_failed_is_marked_later_not_pushed_again(
        make_config: Callable[..., Any], open_services: Opener,
        throwaway: Throwaway) -> None:
    config = make_config(outbound=[{"name": "far", "class": "redis_list",
                                    "init": {"url": throwaway.url, "key": "far"}}])
    hub_a = await open_services(config)
    state: Any = hub_a.hub.state
    commit = state.intake_commit
    calls = 0

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("the state backend blinked")
        return await commit(*args, **kwargs)

    state.intake_commit = flaky
    [result] = await hub_a.hub.submit([{"n": 1, "task_uuid": "u"}])
    assert result.status == "routed"  # pushed: the answer does not depend on the mark
    await hub_a.hub.recover_intake()  # this process retries its mark
    assert calls == 2
    hub_b = await open_services(config)
    assert await hub_b.hub.recover_intake(time.time() + ALIVE_TTL + 1) == 0
    assert len(throwaway.list("far")) == 1


# ------------------------------------------------------------------ what can be stored
async def test_a_task_nested_past_the_limit_is_refused_before_anything_is_pushed(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    from crawlhub.core.jsoncodec import MAX_DEPTH, TooDeepError

    def nested(depth: int) -> dict[str, Any]:
        value: Any = "leaf"
        for _ in range(depth - 1):
            value = [value]
        return {"deep": value}

    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    with pytest.raises(TooDeepError, match=f"more than {MAX_DEPTH} levels"):
        await svc.hub.submit([{"n": 1}, nested(MAX_DEPTH + 1)])
    assert await drain(svc, "o") == []
    [ok] = await svc.hub.submit([nested(MAX_DEPTH)])
    assert ok.status == "routed"


async def test_a_task_holding_nan_is_never_stored_as_null(
        make_config: Callable[..., Any], open_services: Opener, backend: str) -> None:
    import math


    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    tasks = [{"n": 1}, {"n": math.nan}, {"n": {"in": [math.inf]}}, {"n": None}]
    # each such task is refused alone, on every backend; the others are routed
    results = await svc.hub.submit(tasks)
    assert [r.status for r in results] == ["routed", "rejected", "rejected", "routed"]
    assert "NaN and Infinity are not JSON" in (results[1].reason or "")
    assert sorted(repr(p["n"]) for p in await drain(svc, "o")) == ["1", "None"]


def test_a_plain_batch_streams_in_chunks_that_end_small_and_each_fit_one_push() -> None:
    """Every size up to 1,200: the chunks add up to the batch, none is empty or more
    than one push holds (FUSED_CHUNK), a batch over STREAM_MIN ends with STREAM_TAIL,
    and one of STREAM_MIN or fewer goes whole."""
    from crawlhub.hub.intake import FUSED_CHUNK, STREAM_MIN, STREAM_TAIL, stream_chunks

    assert stream_chunks(100) == [50, 35, 15]
    for n in range(1, 1201):
        sizes = stream_chunks(n)
        assert sum(sizes) == n and all(0 < s <= FUSED_CHUNK for s in sizes), (n, sizes)
        if n <= STREAM_MIN:
            assert sizes == [n]
        elif n >= sum(STREAM_TAIL) + STREAM_TAIL[-1]:
            assert tuple(sizes[-len(STREAM_TAIL):]) == STREAM_TAIL, (n, sizes)
        else:
            assert sizes[-1] == STREAM_TAIL[-1], (n, sizes)

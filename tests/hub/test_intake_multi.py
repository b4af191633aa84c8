"""The one-step push of tasks whose uuids the hub drew as plain commands in one
``MULTI``/``EXEC`` (hub/state/intake/redis.py, ids.py): it leaves the same state as the
script's push, its queue ids are unique across hub processes and Redis restarts, and its
tasks lease, nack and ack as any other."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core.keys import hub_keys, queue_keys
from crawlhub.hub.state.intake import ids as ids_module
from crawlhub.hub.state.intake.ids import BLOCK_TTL, MAX_BLOCK, MIN_BLOCK, QueueIds
from tests.hub.conftest import Throwaway, delete_prefix

Opener = Callable[[Any], Any]

#: three outbounds, one with priorities and a result timeout (deadlines), one with a
#: delivery limit: every write the push makes
OUTBOUNDS = [
    {"name": "urgent", "selector": ["kind == 'a'"], "priority": 5, "rt_priority": 9,
     "result_timeout": 600},
    {"name": "limited", "selector": ["kind == 'b'"], "init": {"max_attempts": 4}},
    {"name": "rest"},
]


def tasks(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"n": i, "kind": "abc"[i % 3], "rt": i % 7 == 0} for i in range(start, start + n)]


def config(url: str, prefix: str, tmp_path: Path) -> CrawlhubConfig:
    return CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "outbound": OUTBOUNDS,
        "failure": {"path": str(tmp_path / "failures.jsonl")},
        "storage": {"queues": url, "state": url, "redis_prefix": prefix}})


def count_multi(svc: Any) -> list[int]:
    """Count the pushes that went as a MULTI (the script's push is the other way)."""
    state = svc.hub.state
    native = state._native_push
    counted = [0]

    def counting(*args: Any) -> Any:
        built = native(*args)
        counted[0] += built is not None
        return built

    state._native_push = counting
    return counted


def snapshot(url: str, prefix: str) -> dict[str, Any]:
    """Everything a push wrote, by task (its ``n``), without the uuids and queue ids
    that differ between two pushes of the same tasks."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        k = hub_keys(prefix)
        ledger = client.hgetall(k["ledger"])
        by_uuid = {u: json.loads(e) for u, e in ledger.items()}
        out: dict[str, Any] = {
            "ledger": sorted((e["t"]["n"], e["o"], e["d"] is not None) for e in by_uuid.values()),
            "retention": sorted(by_uuid[u]["t"]["n"] for u in client.zrange(k["retention"], 0, -1)),
            "deadlines": sorted(by_uuid[u]["t"]["n"] for u in client.zrange(k["deadlines"], 0, -1)),
            "counters": client.hgetall(k["counters"]),
            "registry": sorted(client.smembers(f"{prefix}queues")),
            "unpushed": client.zcard(k["unpushed"]),
        }
        for name in ("urgent", "limited", "rest"):
            q = queue_keys(prefix, name)
            payloads = client.hgetall(q["payloads"])
            prios = client.hgetall(q["priorities"])
            ready = client.zrange(q["ready"], 0, -1, withscores=True)
            # (priority 0 is no entry in priorities: queues/redis.py)
            assert len(ready) == len(payloads) >= len(prios) and "0" not in prios.values()
            assert all(int(member) > 0 for member, _ in ready)
            out[name] = {
                "ready": sorted((json.loads(payloads[m])["n"], score, prios.get(m, "0"))
                                for m, score in ready),
                "payloads": sorted((json.loads(p)["n"], sorted(json.loads(p))) for p in
                                   payloads.values()),
                "stats": client.hgetall(q["stats"]),
            }
        return out
    finally:
        client.close()


def queued_ns(url: str, prefix: str) -> list[int]:
    """The ``n`` of every payload in the three queues, sorted (one per message)."""
    client = redis.Redis.from_url(url)
    try:
        return sorted(json.loads(p)["n"] for name in ("urgent", "limited", "rest")
                      for p in client.hvals(queue_keys(prefix, name)["payloads"]))
    finally:
        client.close()


async def submit_all(svc: Any, batch: list[dict[str, Any]], size: int = 100) -> None:
    """Submit in batches of ``size``; each task routed."""
    for start in range(0, len(batch), size):
        results = await svc.hub.submit(batch[start:start + size])
        assert {r.status for r in results} == {"routed"}


async def test_the_multi_push_leaves_what_the_script_push_leaves(
        redis_url: str, unique_name: str, tmp_path: Path, open_services: Opener) -> None:
    """The same 600 tasks, with uuids given (the script) and without (MULTI), each into
    its own prefix: ledger, retention, deadlines, counters, registry and every queue's
    ready set, payloads, priorities and stats agree."""
    given, drawn = f"{unique_name}-given:", f"{unique_name}-drawn:"
    try:
        by_script = await open_services(config(redis_url, given, tmp_path / "a"))
        by_multi = await open_services(config(redis_url, drawn, tmp_path / "b"))
        multi = count_multi(by_multi)
        script = count_multi(by_script)
        batch = tasks(600)
        await submit_all(by_script, [{**t, "task_uuid": f"u{t['n']}"} for t in batch])
        await submit_all(by_multi, batch)
        assert script[0] == 0
        assert multi[0] >= 12  # of 18 (the first pushes ask their queues' ids by script)
        one, other = snapshot(redis_url, given), snapshot(redis_url, drawn)
        assert one == other
        assert other["registry"] == ["limited", "rest", "urgent"]
        assert len(other["ledger"]) == 600
        assert other["urgent"]["stats"]["total"] == "200"
        assert other["limited"]["stats"]["max_attempts"] == "4"
    finally:
        await delete_prefix(redis_url, given)
        await delete_prefix(redis_url, drawn)


async def test_tasks_pushed_by_multi_lease_nack_and_ack(
        redis_url: str, unique_name: str, tmp_path: Path, open_services: Opener) -> None:
    """Leased, nacked back and leased again, every task comes once by its own id."""
    prefix = f"{unique_name}:"
    try:
        svc = await open_services(config(redis_url, prefix, tmp_path))
        multi = count_multi(svc)
        await submit_all(svc, tasks(900))
        assert multi[0] > 0
        seen: list[int] = []
        for name in ("urgent", "limited", "rest"):
            queue = svc.queues.queue(name)
            first = await queue.lease(1000, 60)
            assert len(first) == 300 == len({m.id for m in first})
            assert await queue.nack([m.id for m in first]) == 300
            again = await queue.lease(1000, 60)
            assert sorted(m.payload["n"] for m in again) == sorted(m.payload["n"] for m in first)
            assert await queue.ack([m.id for m in again]) == 300
            seen += [m.payload["n"] for m in again]
        assert sorted(seen) == list(range(900))
    finally:
        await delete_prefix(redis_url, prefix)


async def test_two_hubs_pushing_to_one_queue_by_multi_lose_no_task(
        redis_url: str, unique_name: str, tmp_path: Path, open_services: Opener) -> None:
    """Two hub processes' blocks of ids never overlap: 2 x 3,000 tasks pushed at once
    into the same queues, 6,000 in them."""
    prefix = f"{unique_name}:"
    try:
        one = await open_services(config(redis_url, prefix, tmp_path / "one"))
        other = await open_services(config(redis_url, prefix, tmp_path / "other"))
        counts = count_multi(one), count_multi(other)
        await asyncio.gather(submit_all(one, tasks(3000)), submit_all(other, tasks(3000, 3000)))
        assert min(c[0] for c in counts) > 30
        client = redis.Redis.from_url(redis_url)
        try:
            found = 0
            for name in ("urgent", "limited", "rest"):
                q = queue_keys(prefix, name)
                assert client.zcard(q["ready"]) == client.hlen(q["payloads"])
                found += client.hlen(q["payloads"])
        finally:
            client.close()
        assert found == 6000
        drained = []
        for name in ("urgent", "limited", "rest"):
            drained += [m.payload["n"] for m in await one.queues.queue(name).lease(5000, 60)]
        assert sorted(drained) == list(range(6000))
    finally:
        await delete_prefix(redis_url, prefix)


async def test_ids_held_across_a_redis_restart_that_lost_them_are_not_spent(
        throwaway: Throwaway, tmp_path: Path, open_services: Opener,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub holds blocks of queue ids; Redis restarts without its data (the INCRBY that
    drew them lost) and another hub draws the same numbers again. The first hub's
    connection is new after the restart, so it spends none of what it held: both hubs'
    tasks are all in the queues afterwards (a spent stale id overwrites a payload)."""
    monkeypatch.setattr(ids_module, "BLOCK_TTL", 3600.0)  # (no block ages out meanwhile)
    holder = await open_services(config(throwaway.url, "x:", tmp_path / "holder"))
    multi = count_multi(holder)
    await submit_all(holder, tasks(300))
    assert multi[0] > 0
    held = [ids for ids in holder.hub.state._queue_ids.values() if ids.available(0) > 0]
    assert held, "the hub holds no ids: the test would prove nothing"
    throwaway.stop()
    shutil.rmtree(throwaway.dir)  # (its snapshot: the restarted server starts empty)
    Path(throwaway.dir).mkdir()
    throwaway.start()
    # every connection of the holder's pool new (the intake connects a kept one again
    # once it sees it closed; redis-py's pool hands its own out as they are)
    await holder.hub.state._redis.connection_pool.disconnect()
    fresh = await open_services(config(throwaway.url, "x:", tmp_path / "fresh"))
    await submit_all(fresh, tasks(600, 1000))
    pushed = multi[0]
    await submit_all(holder, tasks(300, 2000))
    assert multi[0] > pushed  # (it pushed by MULTI again, with ids drawn anew)
    found = queued_ns(throwaway.url, "x:")
    assert found == [*range(1000, 1600), *range(2000, 2300)]


def test_queue_ids_spend_blocks_in_order_and_drop_the_old_and_the_forged() -> None:
    ids = QueueIds()
    assert ids.available(0.0) == 0
    size = ids.ask(0.0)
    assert size == MIN_BLOCK and ids.asked
    ids.got(size, size, ids.epoch)  # INCRBY seq 64 -> 64: ids 1..64
    assert not ids.asked and ids.available(0.0) == 64
    assert ids.take(10) == list(range(1, 11))
    # asked again soon: a bigger block; spent after the first, across the seam
    again = ids.ask(0.1)
    assert again == 2 * MIN_BLOCK
    ids.got(1000, again, ids.epoch)
    assert ids.take(60) == [*range(11, 65), *range(1000 - again + 1, 1000 - again + 7)]
    # a block older than BLOCK_TTL is not spent
    assert ids.available(0.1 + BLOCK_TTL + 0.01) == 0
    # an answer to an ask made before a drop is not kept
    ids.ask(5.0)
    epoch = ids.epoch
    ids.drop()
    ids.got(5000, MIN_BLOCK, epoch)
    assert ids.available(5.0) == 0 and not ids.asked
    # nor one that cannot be an INCRBY's of that size (a forged or misplaced reply)
    size = ids.ask(9.0)
    ids.got(1, size, ids.epoch)
    assert ids.available(9.0) == 0 and not ids.asked
    # an ask whose write failed can be made again; sizes stay within bounds
    ids.ask(9.1)
    ids.lost(ids.epoch)
    assert not ids.asked
    for k in range(40):
        ids.ask(10.0 + k * 0.01)
    assert ids.size == MAX_BLOCK
    ids.ask(100.0)
    assert ids.size == MIN_BLOCK


def test_an_entry_around_its_params_reads_as_the_entry_of_its_task() -> None:
    """The one-step push encodes a task once when its params are the task itself
    (hub/intake.py _fused_items): that entry decodes to what the task's own entry
    does, for each outbound, deadline and gate, and a deadline that is not finite is
    refused as dumpb_strict refuses it."""
    from crawlhub.core import jsoncodec
    from crawlhub.hub.state.intake.base import Intake

    task = {"n": 1, "name": "测试", "deep": {"a": [1, 2.5, None]}, "task_uuid": "u1"}
    for outbound, deadline, gate in [("a", None, None), ("a", 12.5, None),
                                     ("b", 12.5, "f\x1f3\x1fk"), ("a", None, None)]:
        intake = Intake(task, outbound, deadline, gate)
        around = intake.entry_around(jsoncodec.dumpb(task))
        assert json.loads(around) == json.loads(intake.dumpb_strict(finite=True))
        assert Intake.loads(around) == Intake.loads(intake.dumpb_strict(finite=True))
    with pytest.raises(ValueError, match="not finite"):
        Intake(task, "a", float("inf")).entry_around(jsoncodec.dumpb(task))


async def test_an_ask_for_ids_that_fails_costs_the_ids_not_the_push(
        redis_url: str, unique_name: str, tmp_path: Path, open_services: Opener) -> None:
    """A queue's id counter that is not a number (written over by hand): the MULTI whose
    INCRBY fails still pushed its tasks, and they are answered routed (answered
    unavailable, a client would send them again: twice in the queue)."""
    prefix = f"{unique_name}:"
    try:
        svc = await open_services(config(redis_url, prefix, tmp_path))
        multi = count_multi(svc)
        await submit_all(svc, tasks(300))
        held = svc.hub.state._queue_ids
        client = redis.Redis.from_url(redis_url)
        try:
            for name in ("urgent", "limited", "rest"):
                client.set(queue_keys(prefix, name)["seq"], "not a number")
            before, asked_at = multi[0], [ids.asked_at for ids in held.values()]
            sent = 0
            # push by MULTI while the blocks held last, each asking for more (and failing)
            while all(ids.available(time.monotonic()) >= 40 for ids in held.values()):
                results = await svc.hub.submit(tasks(30, 1000 + sent))
                assert {r.status for r in results} == {"routed"}
                sent += 30
            assert multi[0] > before and sent > 0
            # asks were made meanwhile, and each came back failed (none is pending)
            assert [ids.asked_at for ids in held.values()] != asked_at
            assert not any(ids.asked for ids in held.values())
            found = sum(client.hlen(queue_keys(prefix, name)["payloads"])
                        for name in ("urgent", "limited", "rest"))
        finally:
            client.close()
        assert found == 300 + sent
    finally:
        await delete_prefix(redis_url, prefix)


async def test_multi_pushes_keep_their_connections_and_no_more_than_held(
        redis_url: str, unique_name: str, tmp_path: Path, open_services: Opener,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A MULTI push gives its connection back to the intake, not to redis-py's pool
    (whose take and give back cost ~8 us a chunk): once warm, sequential batches take
    none from the pool; 12 batches at once are all routed, each chunk on a connection
    of its own, and the intake keeps at most HELD of them afterwards."""
    from crawlhub.hub.state.intake import redis as intake_redis

    prefix = f"{unique_name}:"
    try:
        svc = await open_services(config(redis_url, prefix, tmp_path))
        multi = count_multi(svc)
        state = svc.hub.state
        await submit_all(svc, tasks(600))  # (warm: the queue ids drawn, connections kept)
        taken = [0]
        take = intake_redis.take_connection

        async def counting(redis: Any) -> Any:
            taken[0] += 1
            return await take(redis)

        monkeypatch.setattr(intake_redis, "take_connection", counting)
        before = multi[0]
        await submit_all(svc, tasks(600, 1000))
        assert multi[0] - before >= 12 and taken[0] == 0
        batches = [tasks(100, 10_000 + 100 * k) for k in range(12)]
        answers = await asyncio.gather(*(svc.hub.submit(b) for b in batches))
        assert {r.status for a in answers for r in a} == {"routed"}
        assert taken[0] > 0  # (more chunks in flight than connections kept)
        assert 0 < len(state._held) <= intake_redis.HELD
        assert len({id(c) for c in state._held}) == len(state._held)
        found = []
        for name in ("urgent", "limited", "rest"):
            found += [m.payload["n"] for m in await svc.queues.queue(name).lease(5000, 60)]
        assert sorted(found) == [*range(600), *range(1000, 1600), *range(10_000, 11_200)]
    finally:
        await delete_prefix(redis_url, prefix)


async def test_a_kept_connection_the_server_closed_is_not_pushed_on(
        throwaway: Throwaway, tmp_path: Path, open_services: Opener) -> None:
    """The server restarts while the intake keeps connections: the next pushes find
    them closed (end of stream) and connect them again, as they do one of redis-py's
    pool (which hands its closed ones out unchecked while its maintenance notifications
    are on): every task after the restart is routed, none answered unavailable, and
    each is in its queue."""
    svc = await open_services(config(throwaway.url, "x:", tmp_path))
    await submit_all(svc, tasks(300))
    kept = list(svc.hub.state._held)
    assert kept, "no connection kept: the test would prove nothing"
    throwaway.stop()
    throwaway.start()  # (empty: the tasks routed before are gone with their ids' counter)
    await asyncio.sleep(0.2)  # (the event loop reads each kept connection's end)
    await submit_all(svc, tasks(300, 1000))
    assert all(c.is_connected for c in svc.hub.state._held)
    found = queued_ns(throwaway.url, "x:")
    assert found == list(range(1000, 1300))  # (none written over by an id spent twice)


async def test_a_whole_task_payload_has_the_params_order_on_both_pushes(
        redis_url: str, unique_name: str, tmp_path: Path, open_services: Opener) -> None:
    """An outbound that sends the whole task: its payload and the ledger entry's task
    read as ``OutboundRule.params`` orders them (the task's own keys in its order, then
    every built-in key in BUILTIN_KEYS's order), on the MULTI push (the task's built-in
    keys moved last in place) as on the script's, also for built-in keys a client gave
    first (rt, priority)."""
    from crawlhub.core.task import BUILTIN_KEYS

    prefix = f"{unique_name}:"
    try:
        svc = await open_services(config(redis_url, prefix, tmp_path))
        multi = count_multi(svc)
        batch = [{"rt": False, "priority": 2, "n": i, "kind": "c", "deep": {"z": 1, "a": [1]}}
                 for i in range(200)]
        # drawn uuids: the first batch asks the queue's ids (by script), the next goes
        # by MULTI
        await submit_all(svc, batch[:50])
        before = multi[0]
        await submit_all(svc, batch[50:100])
        assert multi[0] > before
        await submit_all(svc, [{**t, "task_uuid": f"u{t['n']}"} for t in batch[100:]])
        expected = ["n", "kind", "deep", *BUILTIN_KEYS]
        client = redis.Redis.from_url(redis_url)
        try:
            payloads = client.hvals(queue_keys(prefix, "rest")["payloads"])
            entries = client.hvals(hub_keys(prefix)["ledger"])
        finally:
            client.close()
        assert len(payloads) == len(entries) == 200
        for raw in payloads:
            assert list(json.loads(raw)) == expected, raw
        for raw in entries:
            assert list(json.loads(raw)["t"]) == expected, raw
        by_n = {json.loads(p)["n"]: json.loads(p) for p in payloads}
        assert by_n[5]["deep"] == {"z": 1, "a": [1]} and by_n[5]["rt"] is False
        assert by_n[5]["priority"] == 0  # (the outbound's: stamp sets it)
    finally:
        await delete_prefix(redis_url, prefix)

"""What only the Redis backend promises: its key layout, the caller's clock and error
messages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from crawlhub.backends.errors import is_unavailable
from crawlhub.core.errors import QueueError
from crawlhub.core.keys import queue_keys, queue_registry
from crawlhub.queues.redis import RedisQueueBackend
from tests.helpers import FakeClock
from tests.servers import throwaway_valkey

from .conftest import delete_prefix


@pytest.fixture
async def backend(redis_url: str, unique_name: str) -> AsyncIterator[RedisQueueBackend]:
    prefix = f"test:{unique_name}:"
    b = RedisQueueBackend(redis_url, prefix=prefix)
    yield b
    await b.close()
    await delete_prefix(redis_url, prefix)


async def test_every_key_lives_under_the_prefix_and_purge_keeps_only_the_id_counter(
    backend: RedisQueueBackend, redis_url: str
) -> None:
    q = backend.queue("jobs")
    await q.push_many([({"n": i}, i) for i in range(3)])  # (priority 0 has no entry)
    leased = await q.lease(2)
    await q.nack([leased[0].id], dead=True)
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = {k async for k in client.scan_iter(match=f"{backend.prefix}*")}
        layout = queue_keys(backend.prefix, "jobs")
        assert keys == {
            layout[k]
            for k in ("ready", "leased", "dead", "payloads", "priorities", "attempts", "stats",
                      "reasons")
        } | {layout["seq"], queue_registry(backend.prefix)}

        await q.purge()

        assert {k async for k in client.scan_iter(match=f"{backend.prefix}*")} == {layout["seq"]}
    finally:
        await client.aclose()


async def test_deadlines_follow_the_callers_clock_not_the_servers(
        redis_url: str, unique_name: str) -> None:
    # crawlhub.core.clock: every script gets the caller's now; a clock a year off the server's
    # still leases for exactly the visibility timeout.
    clock = FakeClock(start=1_000_000_000.0)
    prefix = f"test:{unique_name}:"
    backend = RedisQueueBackend(redis_url, prefix=prefix, clock=clock)
    try:
        q = backend.queue("jobs")
        await q.push({"n": 1})
        (m,) = await q.lease(1, visibility_timeout=3600)
        assert m.lease_until == pytest.approx(clock() + 3600)
        clock.advance(3599)
        assert await q.lease(1) == []
        clock.advance(1)
        (again,) = await q.lease(1)
        assert again.id == m.id and again.attempts == 2
    finally:
        await backend.close()
        await delete_prefix(redis_url, prefix)


async def test_valkey_scheme_is_accepted(redis_url: str, unique_name: str) -> None:
    url = redis_url.replace("redis://", "valkey://", 1)
    b = RedisQueueBackend(url, prefix=f"test:{unique_name}:")
    try:
        assert await b.queue("jobs").length() == 0
    finally:
        await b.close()


async def test_unreachable_server_is_a_queue_error_without_the_password() -> None:
    b = RedisQueueBackend("redis://:s3cret@127.0.0.1:1/0")
    try:
        with pytest.raises(QueueError, match=r"Redis queue at redis://:\*\*\*@127.0.0.1:1/0") as e:
            await b.queue("jobs").lease(1)
    finally:
        await b.close()
    assert "s3cret" not in str(e.value)
    assert is_unavailable(e.value)  # an outage: the API answers 503, a caller retries later


async def test_a_pushed_batch_is_one_script_call_so_readers_see_all_or_nothing() -> None:
    # Deterministic: a server of our own MONITORs what the push sends. One EVALSHA runs
    # atomically on the server; no reader can run between the writes it makes.
    handshake = ("PING", "HELLO", "CLIENT", "AUTH", "SELECT")
    with throwaway_valkey() as server:
        b = RedisQueueBackend(server.url, prefix="atomic:")
        try:
            q = b.queue("jobs")
            await q.push({"n": "warm-up"})  # loads the script
            sent: list[str] = []
            async with b.redis.monitor() as monitor:
                await q.push_many([({"n": i}, 0) for i in range(2000)])
                await b.redis.echo("pushed")
                while not (command := await monitor.next_command())["command"].startswith(
                        "ECHO"):
                    if command["client_type"] != "lua":
                        sent.append(command["command"].split()[0])
            assert await q.length() == 2001
        finally:
            await b.close()
    assert [verb for verb in sent if verb not in handshake] == ["EVALSHA"]


async def test_priority_0_is_no_entry_and_every_reader_takes_it_as_0(
    backend: RedisQueueBackend, redis_url: str
) -> None:
    """A push writes no priorities entry for priority 0 (one field less per message);
    lease, nack back, a lease ended early and the dead letters all read such a message
    as priority 0 and keep the order, as they read one an older push wrote "0" for."""
    q = backend.queue("mixed")
    ids = [f"{int(i):016d}" for i in  # (the members as stored: 16 digits)
           await q.push_many([({"n": 0}, 0), ({"n": 1}, 5), ({"n": 2}, 0), ({"n": 3}, -2)])]
    layout = queue_keys(backend.prefix, "mixed")
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert await client.hgetall(layout["priorities"]) == {ids[1]: "5", ids[3]: "-2"}
        # as an older push left one: "0" stored (read the same)
        await client.hset(layout["priorities"], ids[2], "0")
        first = await q.lease(10)
        assert [(m.payload["n"], m.priority) for m in first] == [(1, 5), (0, 0), (2, 0), (3, -2)]
        assert await q.nack([m.id for m in first]) == 4  # back to ready, by priority
        again = await q.lease(10)
        assert [(m.payload["n"], m.priority) for m in again] == [(1, 5), (0, 0), (2, 0), (3, -2)]
        assert await q.requeue_leased() == 4  # leases ended early: ready again
        third = await q.lease(10)
        assert [(m.payload["n"], m.priority) for m in third] == [(1, 5), (0, 0), (2, 0), (3, -2)]
        await q.nack([m.id for m in third], dead=True)
        dead = await q.dead_letters(10)
        assert sorted((m.payload["n"], m.priority) for m in dead) == [(0, 0), (1, 5), (2, 0),
                                                                       (3, -2)]
    finally:
        await client.aclose()

"""``redis_client``: one factory for every Redis/Valkey client, on real servers.

A throwaway Valkey server of the test's own is stopped and started again; the shared
server is never touched.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from crawlhub.backends.backend import BackendURLError
from crawlhub.backends.errors import backend_errors
from crawlhub.backends.redis import redis_client
from crawlhub.core.errors import BackendUnavailable
from tests.servers import throwaway_valkey

LOGGER = "crawlhub.storage.redis"


def outage_lines(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and word in r.getMessage()]


async def test_client_reconnects_after_the_server_restarts_and_logs_the_outage_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with throwaway_valkey() as server:
        client = redis_client(server.url, name="test store")
        try:
            await client.set("k", "before")
            server.stop()
            for _ in range(3):  # three failed calls during one outage
                with pytest.raises(BackendUnavailable), backend_errors("test store"):
                    await client.get("k")
            server.start()
            await client.set("k", "after")
            assert await client.get("k") == b"after"
            await client.set("k", "again")
        finally:
            await client.aclose()
    assert len(outage_lines(caplog, "unreachable")) == 1
    assert len(outage_lines(caplog, "reachable again")) == 1
    assert server.url in outage_lines(caplog, "unreachable")[0]


async def test_pipelines_reconnect_after_a_restart_too() -> None:
    with throwaway_valkey() as server:
        client = redis_client(server.url, name="pipes")
        try:
            await client.ping()
            server.stop()
            server.start()
            async with client.pipeline(transaction=True) as pipe:
                pipe.set("a", 1).incr("a")
                assert await pipe.execute() == [True, 2]
        finally:
            await client.aclose()


async def test_an_unreachable_server_fails_after_its_retries_with_the_password_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    client = redis_client("redis://:s3cret@127.0.0.1:1/0", name="nowhere", retries=2)
    try:
        with pytest.raises(RedisConnectionError):
            await client.ping()
    finally:
        await client.aclose()
    (line,) = outage_lines(caplog, "unreachable")
    assert "redis://:***@127.0.0.1:1/0" in line and "s3cret" not in line
    assert "nowhere" in line


def test_valkey_schemes_map_to_the_redis_client_and_options_are_set() -> None:
    client = redis_client("valkeys://127.0.0.1:6380/3", name="tls", socket_timeout=7.0)
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("127.0.0.1", 6380, 3)
    assert kwargs["socket_timeout"] == 7.0
    assert kwargs["socket_connect_timeout"] > 0
    assert kwargs["health_check_interval"] > 0
    assert kwargs["retry"].get_retries() > 0


def test_a_url_that_is_not_redis_is_refused_naming_the_user() -> None:
    with pytest.raises(BackendURLError, match="outbound 'o' URL 'postgresql://db/x' has no "
                                              "scheme crawlhub can open; accepted: redis://"):
        redis_client("postgresql://db/x", name="outbound 'o'")


def test_pack_command_writes_the_bytes_redis_py_writes() -> None:
    from redis.asyncio.connection import Connection

    from crawlhub.backends.redis import pack_command

    args = ("EVALSHA", "f" * 40, 3, "crawlhub:hub:ledger", "crawlhub:q:队列:ready",
            b"\x00\r\n" + b"x" * 70_000, b"", "new", -17, 1764300000.125, "crawlhub:hub:ledger")
    cache: dict[str, bytes] = {}
    expected = b"".join(Connection().pack_command(*args))
    assert b"".join(pack_command(args, cache)) == expected
    assert "crawlhub:q:队列:ready" in cache
    assert b"".join(pack_command(args, cache)) == expected  # the names from the cache
    with pytest.raises(TypeError, match="NoneType"):
        pack_command(("XADD", None), cache)


async def test_a_batch_past_its_deadline_drops_its_connection_and_the_next_batch_reads_its_own(
    redis_url: str,
) -> None:
    """write_commands reads a batch's replies under one deadline (socket_timeout): a reply
    that does not come in time is a TimeoutError, and the late reply cannot reach the next
    batch, whose connection is a fresh one."""
    from redis.exceptions import ResponseError
    from redis.exceptions import TimeoutError as RedisTimeout

    from crawlhub.backends.redis import write_commands

    client = redis_client(redis_url, name="batch", socket_timeout=1.0)
    names: dict[str, bytes] = {}
    key = f"batch-test-{id(names)}"
    try:
        replies = await (await write_commands(
            client, [("SET", key, b"v"), ("INCR", key), ("GET", key)], names))
        assert replies[0] is True or replies[0] == b"OK"
        assert isinstance(replies[1], ResponseError) and replies[2] == b"v"
        # BLPOP on an empty list answers after 5 s: past the 1 s deadline
        pending = await write_commands(client, [("PING",), ("BLPOP", f"{key}-empty", b"5")],
                                       names)
        with pytest.raises(RedisTimeout, match="2 replies"):
            await pending
        assert await (await write_commands(client, [("ECHO", b"mine"), ("GET", key)],
                                           names)) == [b"mine", b"v"]
    finally:
        await client.delete(key, f"{key}-empty")
        await client.aclose()


async def test_a_long_batch_reads_every_reply_in_place_with_its_error_type(
    redis_url: str,
) -> None:
    """Replies read already are taken from the parser's reader (backends/redis.py
    _replies): 600 replies, errors among them in their places and of redis-py's types
    (NoScriptError for an unknown script), as redis-py's read_response gives them."""
    from redis.exceptions import NoScriptError, ResponseError

    from crawlhub.backends.redis import write_commands

    client = redis_client(redis_url, name="long batch")
    names: dict[str, bytes] = {}
    key = f"long-batch-{id(names)}"
    try:
        await client.set(key, b"text")
        commands: list[tuple[Any, ...]] = []
        for i in range(200):
            commands += [("ECHO", b"%d" % i), ("INCR", key), ("EVALSHA", "0" * 40, 0)]
        replies = await (await write_commands(client, commands, names))
        assert replies[0::3] == [b"%d" % i for i in range(200)]
        assert all(type(r) is ResponseError for r in replies[1::3])
        assert all(isinstance(r, NoScriptError) for r in replies[2::3])
        assert await (await write_commands(client, [("GET", key)], names)) == [b"text"]
    finally:
        await client.delete(key)
        await client.aclose()


async def test_a_write_to_a_frozen_server_times_out_and_the_next_batch_goes_through() -> None:
    """write_commands writes without redis-py's wait_for: a write the server does not
    take (its process stopped, the socket's buffers full) still ends at the connection's
    socket_timeout, as redis-py's TimeoutError, and the connection is dropped; once the
    server runs again the next batch is answered on a fresh connection."""
    import os
    import signal

    from redis.exceptions import TimeoutError as RedisTimeout

    from crawlhub.backends.redis import write_commands

    names: dict[str, bytes] = {}
    with throwaway_valkey() as server:
        client = redis_client(server.url, name="frozen", socket_timeout=1.0)
        try:
            assert await (await write_commands(client, [("PING",)], names)) == [b"PONG"]
            pid = server._process.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                with pytest.raises(RedisTimeout, match="writing"):
                    # far more than the kernel's socket buffers hold; a write that never
                    # ended would fail here as asyncio's TimeoutError, not redis-py's
                    await asyncio.wait_for(write_commands(
                        client, [("SET", "big", b"x" * (64 << 20))], names), 30)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert await (await write_commands(client, [("ECHO", b"again")], names)) \
                == [b"again"]
            assert await client.exists("big") == 0  # the cut write stored nothing
        finally:
            await client.aclose()


async def test_a_write_on_a_connection_the_server_closed_is_a_connection_error() -> None:
    """A server that went away under a pooled connection: the write (or the read of its
    reply) raises redis-py's ConnectionError, which crawlhub reports as an outage; the
    server back, the next batch is answered."""
    from crawlhub.backends.redis import write_commands

    names: dict[str, bytes] = {}
    with throwaway_valkey() as server:
        client = redis_client(server.url, name="closed", retries=0)
        try:
            assert await (await write_commands(client, [("PING",)], names)) == [b"PONG"]
            server.stop()
            with pytest.raises((RedisConnectionError, ConnectionError, OSError)):
                await (await write_commands(client, [("PING",)], names))
            server.start()
            assert await (await write_commands(client, [("ECHO", b"back")], names)) \
                == [b"back"]
        finally:
            await client.aclose()

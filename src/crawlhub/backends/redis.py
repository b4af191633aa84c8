"""The one Redis client factory: every module that talks to Redis or Valkey gets its client here.

Each client has socket timeouts, a health check on idle connections and a retry policy
with exponential backoff on connection errors and timeouts; an outage is logged once,
with the URL's password masked, and its end once more.

:func:`lua` loads the Lua scripts a module sends: files in the ``lua/`` folder of its
package, shipped in the wheel beside the code.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

from crawlhub.backends.backend import Backend, BackendURLError

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger("crawlhub.storage.redis")

T = TypeVar("T")

#: Retries of a command (and, inside each, of the connect) before the error surfaces.
RETRIES = 3
BACKOFF_BASE = 0.025
BACKOFF_CAP = 0.5
SOCKET_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
HEALTH_CHECK_INTERVAL = 15.0


class Outage:
    """Whether the server of one client is down; logs the start and the end of an outage."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.down = False
        self.failures = 0

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        if not self.down:
            self.down = True
            log.warning("Redis %s at %s is unreachable (%s: %s); retrying with backoff",
                        self.name, self.url, type(error).__name__, error)

    def succeeded(self) -> None:
        if self.down:
            self.down = False
            log.warning("Redis %s at %s is reachable again", self.name, self.url)


def _retry_class() -> type[Any]:
    from redis.asyncio.retry import Retry

    class LoggedRetry(Retry):
        """redis-py's Retry that reports failures and recoveries to a shared :class:`Outage`.

        redis-py deep-copies the retry into every connection; the copies share the outage.
        """

        def __init__(self, backoff: Any, retries: int, outage: Outage) -> None:
            super().__init__(backoff, retries)
            self.outage = outage

        def __deepcopy__(self, memo: dict[int, Any]) -> LoggedRetry:
            return LoggedRetry(copy.deepcopy(self._backoff, memo), self._retries, self.outage)

        async def call_with_retry(  # type: ignore[override]
            self,
            do: Callable[[], Awaitable[T]],
            fail: Callable[..., Any],
            is_retryable: Callable[[Exception], bool] | None = None,
            with_failure_count: bool = False,
        ) -> T:
            outage = self.outage

            async def failed(error: Exception, *count: int) -> Any:
                outage.failed(error)
                result = fail(error, *count) if with_failure_count else fail(error)
                if hasattr(result, "__await__"):
                    await result

            result = await super().call_with_retry(do, failed, is_retryable,
                                                   with_failure_count=with_failure_count)
            outage.succeeded()
            return result

    return LoggedRetry


_LOGGED_RETRY: type[Any] | None = None


def redis_client(
    url: str | Backend,
    *,
    name: str,
    retries: int = RETRIES,
    backoff_base: float = BACKOFF_BASE,
    backoff_cap: float = BACKOFF_CAP,
    socket_timeout: float | None = SOCKET_TIMEOUT,
    connect_timeout: float = CONNECT_TIMEOUT,
    health_check_interval: float = HEALTH_CHECK_INTERVAL,
    **kwargs: Any,
) -> aioredis.Redis:
    """An asyncio Redis client for ``url`` (``redis``, ``rediss``, ``valkey``, ``valkeys``,
    ``unix``); ``name`` says who uses it in logs (``queues``, ``outbound 'spider'``...).

    ``socket_timeout`` must exceed the longest blocking command the caller sends (BLMOVE,
    XREADGROUP ``block``). A bad URL raises :class:`~crawlhub.backends.backend.BackendURLError`;
    a missing client library a :class:`~crawlhub.core.errors.MissingExtraError` naming the extra.
    """
    global _LOGGED_RETRY
    parsed = Backend.parse(url, kinds=("redis",), what=name)
    parsed.require(name)  # one line naming the extra, no traceback
    import redis.asyncio as aioredis
    from redis.backoff import ExponentialBackoff

    if _LOGGED_RETRY is None:
        _LOGGED_RETRY = _retry_class()
    retry = _LOGGED_RETRY(ExponentialBackoff(cap=backoff_cap, base=backoff_base), retries,
                          Outage(name, parsed.redacted))
    try:
        return aioredis.Redis.from_url(
            parsed.dsn,
            retry=retry,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=health_check_interval,
            **kwargs,
        )
    except ValueError as exc:
        raise BackendURLError(
            f"{name} URL {parsed.redacted!r} is malformed ({exc}): use redis://host:6379/0"
        ) from None


def pack_command(args: Sequence[Any], cache: dict[str, bytes]) -> list[bytes]:
    """One command in Redis's protocol (RESP), as redis-py's ``send_packed_command``
    takes it, for hot paths that send the same names again and again: each ``str``
    argument (command, script, key and field names) is encoded once and kept in
    ``cache`` (up to 10,000 of them: pass anything that varies as bytes); ``bytes`` go as
    they are (a large body is not copied), ints and floats as redis-py writes them.
    About a tenth of redis-py's own ``pack_command`` over a script's ~90 arguments."""
    out = [b"*%d\r\n" % len(args)]
    add = out.append
    for arg in args:
        kind = type(arg)
        if kind is str:
            head = cache.get(arg)
            if head is None:
                raw = arg.encode()
                head = b"$%d\r\n%s\r\n" % (len(raw), raw)
                if len(cache) < 10_000:
                    cache[arg] = head
            add(head)
        elif kind is bytes:
            add(b"$%d\r\n" % len(arg))
            add(arg)
            add(b"\r\n")
        elif kind is int or kind is float:
            raw = repr(arg).encode()
            add(b"$%d\r\n%s\r\n" % (len(raw), raw))
        else:
            raise TypeError(f"a Redis command argument of type {kind.__name__}")
    return out


async def write_commands(redis: Any, commands: Sequence[Sequence[Any]],
                         names: dict[str, bytes]) -> Coroutine[Any, Any, list[Any]]:
    """Write ``commands`` (packed by :func:`pack_command`, ``names`` its cache) in one
    write on a connection of ``redis``'s pool; returns once they are written, with a
    coroutine that reads their replies in order: an error reply in its place as its
    exception, the connection back in the pool after (dropped if it failed, replies may
    be left on it). A pipeline without redis-py's packing and parsing per command, whose
    caller may work while Redis does; it must await (or run) the coroutine, which holds
    the connection until then."""
    packed: list[bytes] = []
    for command in commands:
        packed += pack_command(command, names)
    return await write_on(redis, await take_connection(redis), packed, len(commands))


async def take_connection(redis: Any) -> Any:
    """A connection of ``redis``'s pool, connected (for :func:`write_on`, or back with
    :func:`give_back`)."""
    return await redis.connection_pool.get_connection()


async def give_back(redis: Any, conn: Any) -> None:
    await redis.connection_pool.release(conn)


def socket_of(conn: Any) -> Any:
    """What stands for the socket ``conn`` is connected by: another one after it
    connected again (None when not redis-py's layout)."""
    return getattr(conn, "_writer", None)


async def write_on(redis: Any, conn: Any, packed: list[bytes], n: int,
                   keep: Callable[[Any], bool] | None = None
                   ) -> Coroutine[Any, Any, list[Any]]:
    """:func:`write_commands` of commands packed already (``packed``, ``n`` of them) on
    ``conn``, taken by :func:`take_connection` or kept by the caller. ``keep``: once
    every reply is read, ``conn`` goes to ``keep`` first (True: kept there, not given
    back to the pool); a connection dropped on an error always goes back to the pool."""
    pool = redis.connection_pool
    try:
        await _send(conn, packed)
    except BaseException:
        with contextlib.suppress(Exception):
            await conn.disconnect()
        await pool.release(conn)
        raise
    return _replies(pool, conn, n, keep)


async def _send(conn: Any, packed: list[bytes]) -> None:
    """redis-py's ``send_packed_command`` without its ``wait_for`` on every write (a
    task and a timer: ~35 us of CPU a command on the 2-core machine, a third of a
    round trip's): the bytes go to the transport at once, and only a drain that must
    wait (the socket's buffer full) waits under the connection's ``socket_timeout``.
    Errors as redis-py raises them; the caller drops the connection."""
    writer = getattr(conn, "_writer", None)
    if writer is None or not conn.is_connected:  # not redis-py's layout: its own way
        await conn.send_packed_command(packed)
        return
    if conn.health_check_interval:
        await conn.check_health()  # a PING when one is due, as redis-py sends
    try:
        writer.writelines(packed)
        if writer.transport.get_write_buffer_size() or writer.transport.is_closing():
            async with asyncio.timeout(conn.socket_timeout):
                await writer.drain()
        else:
            await writer.drain()  # raises at once for a connection lost meanwhile
    except TimeoutError:
        raise _errors()[2]("Timeout writing to socket") from None
    except OSError as exc:
        raise _errors()[0](f"Error while writing to socket: {exc}") from exc


_ERRORS: tuple[type[Exception], type[Exception], type[Exception]] | None = None


def _errors() -> tuple[type[Exception], type[Exception], type[Exception]]:
    """redis-py's ConnectionError, ResponseError and TimeoutError, imported once (an
    import statement in a function costs ~0.45 us a call, and the write and the reading
    of replies run once a chunk)."""
    global _ERRORS
    if _ERRORS is None:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import ResponseError
        from redis.exceptions import TimeoutError as RedisTimeout

        _ERRORS = (RedisConnectionError, ResponseError, RedisTimeout)
    return _ERRORS


def _parsed(conn: Any) -> tuple[Any, Any, Any]:
    """The hiredis reader of ``conn``'s parser, its "not enough data" answer and the
    parser, when the connection is redis-py's with hiredis (else Nones): the reader's
    ``gets()`` gives the next reply read already, which :func:`_replies` takes as
    redis-py's parser would."""
    parser = getattr(conn, "_parser", None)
    if type(parser).__name__ != "_AsyncHiredisParser" \
            or not getattr(parser, "_connected", False):
        return None, None, None
    more = getattr(sys.modules.get(type(parser).__module__), "NOT_ENOUGH_DATA", None)
    reader = getattr(parser, "_reader", None)
    if more is None or reader is None:
        return None, None, None
    return reader, more, parser


async def _pushed_over(reply: Any, reader: Any, parser: Any) -> Any:
    """The first reply after the push notifications (RESP3) from ``reply`` on, each
    handled by redis-py's parser as it would."""
    push = parser._hiredis_PushNotificationType
    while isinstance(reply, push):
        await parser.handle_push_response(reply)
        reply = reader.gets()
    return reply


async def _replies(pool: Any, conn: Any, n: int,
                   keep: Callable[[Any], bool] | None = None) -> list[Any]:
    RedisConnectionError, ResponseError, RedisTimeout = _errors()  # noqa: N806
    # One deadline for the batch (the connection's socket_timeout), not one per reply:
    # redis-py's read_response opens a timeout context per call unless told to block
    # (math.inf), ~10% of a download center job's CPU at 4,000 replies/s.
    deadline = conn.socket_timeout
    reader, more, parser = _parsed(conn)
    push = getattr(parser, "_hiredis_PushNotificationType", None)
    try:
        out: list[Any] = []
        async with asyncio.timeout(deadline):
            for _ in range(n):
                # A reply read already is taken from the reader: redis-py's read_response
                # costs ~2 us a reply around it (a MULTI's replies are ~40 a chunk)
                reply = more if reader is None else reader.gets()
                if reply is not more and type(reply) is not bytes and reply is not None:
                    if push is not None and isinstance(reply, push):
                        reply = await _pushed_over(reply, reader, parser)
                    if isinstance(reply, RedisConnectionError):
                        raise reply  # (as redis-py's parser raises it)
                    if type(reply) is list and reply \
                            and isinstance(reply[0], RedisConnectionError):
                        raise reply[0]
                if reply is more:
                    try:
                        reply = await conn.read_response(timeout=math.inf)
                    except ResponseError as exc:  # read whole: the next replies follow it
                        reply = exc
                out.append(reply)
    except BaseException as exc:  # replies may be left on it: drop the connection
        with contextlib.suppress(Exception):
            await conn.disconnect()
        await pool.release(conn)
        if isinstance(exc, TimeoutError):  # the batch's deadline
            raise RedisTimeout(f"Timeout reading {n} replies from Redis ({deadline} s)"
                               ) from None
        raise
    if keep is None or not keep(conn):
        await pool.release(conn)
    return out


def lua(package: str | None, *names: str) -> str:
    """The Lua scripts ``names`` of ``package`` (files in its ``lua/`` folder), joined in
    order, so a shared prelude and a body make one script: ``lua(__package__,
    "prelude.lua", "push.lua")``. Each file is read once."""
    if not package:
        raise ValueError("lua() needs the package that holds the scripts (__package__)")
    if not names:
        raise ValueError("lua() needs the names of the scripts")
    return "".join(_lua_file(package, name) for name in names)


@functools.cache
def _lua_file(package: str, name: str) -> str:
    return resources.files(package).joinpath("lua").joinpath(name).read_text(encoding="utf-8")

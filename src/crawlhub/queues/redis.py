"""The distributed queue backend: each named queue is a few Redis keys moved by Lua scripts.

Every state change is one script, so it is atomic across any number of hub and worker
processes. Lease deadlines follow :mod:`crawlhub.core.clock`: the caller's clock (epoch
seconds), handed to every script as ``now``; no script reads the server's ``TIME``.

Layout (key names from :func:`crawlhub.core.keys.queue_keys`, one hash slot per queue):

- ``ready``: sorted set, score ``-priority``, member the id zero-padded to 16 digits, so
  equal scores pop in id order (FIFO) by Redis' lexicographic tie-break. Scores are
  small integers and ids never enter a float: ordering is exact for every priority in
  [-2^31, 2^31 - 1] and every id below 2^53.
- ``leased``: sorted set, score the lease deadline in integer milliseconds.
- ``dead``: list of ids in the order they died; ``reasons``: hash id -> why it died.
- ``payloads`` / ``priorities`` / ``attempts``: hashes keyed by id; a message of
  priority 0 has no entry in ``priorities`` (pushes write none: a field less to store
  for most messages; every reader takes a missing one as 0). A crawlhub before
  this layout fails on such a message (leasing it, returning it to ready): the
  processes sharing a Redis are upgraded together.
- ``stats``: hash of the persistent counters ``total success failed retried``,
  ``failed:<kind>`` (why messages died) and the configured delivery limit ``max_attempts``.
- ``seq``: the id counter; kept by ``purge`` so an id is never reused.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError, RedisError

from crawlhub.backends.backend import Backend
from crawlhub.backends.redis import lua, redis_client
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.errors import QueueError
from crawlhub.core.keys import DEFAULT_PREFIX, queue_keys, queue_registry
from crawlhub.core.redact import redact_url
from crawlhub.queues.common import (
    DEFAULT_MAX_ATTEMPTS,
    BaseQueue,
    QueueCounters,
    Ref,
    Row,
    check_queue_name,
    dead_kind,
    encode_groups,
)

T = TypeVar("T")

_KEY_ORDER = ("ready", "leased", "dead", "payloads", "priorities", "attempts", "stats", "seq",
              "reasons")

_PRELUDE = lua(__package__, "prelude.lua")

PUSH_ROWS_LUA = lua(__package__, "push_rows.lua")

_PUSH = PUSH_ROWS_LUA + lua(__package__, "push.lua")

_LEASE = lua(__package__, "lease.lua")

_ACK = lua(__package__, "ack.lua")

_NACK = lua(__package__, "nack.lua")

_EXTEND = lua(__package__, "extend.lua")

_REQUEUE = lua(__package__, "requeue.lua")

_COUNTERS = lua(__package__, "counters.lua")

_DEAD_LETTERS = lua(__package__, "dead_letters.lua")

_PURGE = lua(__package__, "purge.lua")

_SCRIPTS = {
    "push": _PUSH,
    "lease": _LEASE,
    "ack": _ACK,
    "nack": _NACK,
    "extend": _EXTEND,
    "requeue": _REQUEUE,
    "counters": _COUNTERS,
    "dead_letters": _DEAD_LETTERS,
    "purge": _PURGE,
}


def _member(num: int) -> str:
    return f"{num:016d}"


def _push_args(rows: list[tuple[str, int]], limit: int = 0) -> list[bytes | str]:
    """A push's arguments: every payload in one blob, their lengths, their priorities,
    the queue's configured delivery limit (0: none)."""
    blobs = [data.encode() for data, _ in rows]
    return [
        b"".join(blobs),
        ",".join(str(len(blob)) for blob in blobs),
        ",".join(str(priority) for _, priority in rows),
        str(limit),
    ]


def _ref_arg(refs: list[Ref]) -> str:
    return ",".join(f"{_member(r.num)}:{'' if r.attempt is None else r.attempt}" for r in refs)


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisQueueBackend:
    """Queues on a Redis (or Valkey) server; ``url`` is ``redis://host:port/db``.

    ``prefix`` starts every key, so deployments and tests can share one server.
    ``clock`` (epoch seconds; default the system clock) times every lease, as
    :mod:`crawlhub.core.clock` says; tests pass a fake one.
    """

    def __init__(
        self,
        url: str | Backend,
        prefix: str = DEFAULT_PREFIX,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.url = str(url)
        self.prefix = prefix
        self.clock: Clock = clock or system_clock
        self.redis = redis_client(url, name="queues")
        prelude = _PRELUDE.replace("@DEFAULT_MAX_ATTEMPTS@", str(DEFAULT_MAX_ATTEMPTS))
        self.scripts = {n: self.redis.register_script(prelude + s) for n, s in _SCRIPTS.items()}
        self._queues: dict[str, RedisQueue] = {}

    def __repr__(self) -> str:
        return f"<RedisQueueBackend {redact_url(self.url)} prefix={self.prefix!r}>"

    def queue(self, name: str, *, max_attempts: int | None = None) -> RedisQueue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = RedisQueue(check_queue_name(name), self, max_attempts)
        else:
            q.configure(max_attempts)
        return q

    async def push_multi(
        self, groups: Mapping[str, Sequence[tuple[dict[str, Any], int]]]
    ) -> dict[str, list[str]]:
        encoded = encode_groups(groups)
        if not encoded:
            return {}
        queues = [self.queue(name) for name in encoded]
        unregistered = [q.name for q in queues if not q._registered]
        if unregistered:
            await self.call("register queues",
                            self.redis.sadd(queue_registry(self.prefix), *unregistered))
            for q in queues:
                q._registered = True
        script = self.scripts["push"]
        for attempt in (1, 2):
            # Plain EVALSHA in a pipeline: one round trip for every queue (a pipeline
            # holding Script objects would first ask SCRIPT EXISTS).
            async with self.redis.pipeline(transaction=False) as pipe:
                for q, rows in zip(queues, encoded.values(), strict=True):
                    args = _push_args(rows, q.limit)
                    pipe.evalsha(script.sha, len(q._keys), *q._keys, *args)
                try:
                    firsts = await self.call("push to queues", pipe.execute())
                    break
                except QueueError as exc:
                    if attempt == 2 or not isinstance(exc.__cause__, NoScriptError):
                        raise
                    await self.redis.script_load(script.script)
        return {
            name: [str(n) for n in range(int(first), int(first) + len(rows))]
            for (name, rows), first in zip(encoded.items(), firsts, strict=True)
        }

    async def names(self) -> list[str]:
        members = await self.call("names", self.redis.smembers(queue_registry(self.prefix)))
        return sorted(m.decode() if isinstance(m, bytes) else m for m in members)

    async def close(self) -> None:
        await self.redis.aclose()

    def now_arg(self) -> str:
        """The clock argument of a script: the caller's now in integer milliseconds."""
        return str(math.floor(self.clock() * 1000))

    async def call(self, op: str, awaitable: Awaitable[T]) -> T:
        """Await a Redis call; Redis errors become a QueueError naming the server and op."""
        try:
            return await awaitable
        except RedisError as exc:
            raise QueueError(
                f"Redis queue at {redact_url(self.url)}: {op} failed: {exc} "
                "(check the server is running and the URL is right)"
            ) from exc


class RedisQueue(BaseQueue):
    """One named queue on a :class:`RedisQueueBackend`."""

    def __init__(self, name: str, backend: RedisQueueBackend,
                 max_attempts: int | None = None) -> None:
        super().__init__(name, max_attempts)
        self.backend = backend
        keys = queue_keys(backend.prefix, name)
        self._keys = [keys[k] for k in _KEY_ORDER]
        self._registered = False

    async def _run(self, script: str, op: str, args: list[Any]) -> Any:
        b = self.backend
        return await b.call(
            f"{op} on queue {self.name!r}", b.scripts[script](keys=self._keys, args=args)
        )

    async def _push(self, rows: list[tuple[str, int]]) -> list[int]:
        b = self.backend
        args = _push_args(rows, self.limit)
        if not self._registered:
            # Once per queue object: a pipeline holding a script costs redis-py an extra
            # SCRIPT EXISTS round trip, so later pushes run the script alone.
            await b.call("register queue", b.redis.sadd(queue_registry(b.prefix), self.name))
            self._registered = True
        first = await self._run("push", "push", args)
        return list(range(int(first), int(first) + len(rows)))

    async def _lease(self, n: int, timeout: float) -> list[Row]:
        args = [self.backend.now_arg(), _ms(timeout), n, self.limit]
        out = await self._run("lease", "lease", args)
        until = int(out[0]) / 1000
        return [
            Row(int(out[i]), out[i + 3], int(out[i + 1]), int(out[i + 2]), until)
            for i in range(1, len(out), 4)
        ]

    async def _ack(self, refs: list[Ref]) -> int:
        return int(await self._run("ack", "ack", [_ref_arg(refs)]))

    async def _nack(self, refs: list[Ref], dead: bool, reason: str | None) -> int:
        args = ["1" if dead else "0", _ref_arg(refs), reason or "", self.limit,
                dead_kind(reason)]
        return int(await self._run("nack", "nack", args))

    async def _extend(self, refs: list[Ref], timeout: float) -> int:
        args = [self.backend.now_arg(), _ms(timeout), _ref_arg(refs)]
        return int(await self._run("extend", "extend", args))

    async def _requeue_expired(self, everything: bool = False) -> int:
        # a deadline is integer ms, so 2**53 (the largest exact Lua number) is past them all
        args = [str(2**53) if everything else self.backend.now_arg(), self.limit]
        return int(await self._run("requeue", "requeue expired leases", args))

    async def _length(self) -> int:
        c = await self._counters()
        return c.ready + c.leased

    async def _counters(self) -> QueueCounters:
        raw = await self._run("counters", "stats", [self.backend.now_arg(), self.limit])
        return QueueCounters(*(int(v or 0) for v in raw))

    async def _dead_letters(self, n: int) -> list[Row]:
        out = await self._run("dead_letters", "dead_letters", [n])
        return [
            Row(int(out[i]), out[i + 3], int(out[i + 1]), int(out[i + 2]), 0.0,
                (out[i + 4].decode() if isinstance(out[i + 4], bytes) else out[i + 4]) or None)
            for i in range(0, len(out), 5)
        ]

    async def _purge(self) -> int:
        b = self.backend
        async with b.redis.pipeline(transaction=False) as pipe:
            await b.scripts["purge"](keys=self._keys, args=[], client=pipe)
            pipe.srem(queue_registry(b.prefix), self.name)
            k, _ = await b.call(f"purge of queue {self.name!r}", pipe.execute())
        self._registered = False
        return int(k)

"""The embedded queue backend: every named queue in one SQLite file (WAL mode).

One connection per backend lives on its own thread; each operation is one transaction
there. Writes take ``BEGIN IMMEDIATE``, so several processes may share the file safely.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from crawlhub.errors import QueueError
from crawlhub.queues.base import Message
from crawlhub.queues.common import (
    BaseQueue,
    Counters,
    Ref,
    check_name,
    encode_groups,
    message,
)
from crawlhub.storage.sqlite import SqliteDB
from crawlhub.storage.sqlite import immediate as _write
from crawlhub.storage.urls import parse_backend_url

T = TypeVar("T")

READY, LEASED, DEAD = 0, 1, 2

# Partial indexes keep each state's scan O(log n): lease reads `ready` in priority
# order, expiry reads `leased` by deadline, dead_letters reads `dead` in death order.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    state INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    lease_until REAL NOT NULL DEFAULT 0,
    dead_seq INTEGER,
    payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_messages_ready
    ON queue_messages (queue, priority DESC, id) WHERE state = 0;
CREATE INDEX IF NOT EXISTS queue_messages_leased
    ON queue_messages (queue, lease_until) WHERE state = 1;
CREATE INDEX IF NOT EXISTS queue_messages_dead
    ON queue_messages (queue, dead_seq) WHERE state = 2;
CREATE TABLE IF NOT EXISTS queue_counters (
    queue TEXT PRIMARY KEY,
    total INTEGER NOT NULL DEFAULT 0,
    success INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    retried INTEGER NOT NULL DEFAULT 0,
    ready INTEGER NOT NULL DEFAULT 0,
    leased INTEGER NOT NULL DEFAULT 0,
    dead INTEGER NOT NULL DEFAULT 0
);
"""

_COUNTER_NAMES = ("total", "success", "failed", "retried", "ready", "leased", "dead")

# A ref matches a leased message; with a receipt, only the lease it names.
_MATCH_LEASED = (
    "id = :num AND queue = :queue AND state = 1 AND (:attempt IS NULL OR attempts = :attempt)"
)


def _bump(conn: sqlite3.Connection, queue: str, **deltas: int) -> None:
    """Add ``deltas`` to the queue's counters row (created on first use)."""
    deltas = {k: v for k, v in deltas.items() if v}
    if not deltas:
        return
    cols = ", ".join(deltas)
    marks = ", ".join(f":{k}" for k in deltas)
    sets = ", ".join(f"{k} = {k} + :{k}" for k in deltas)
    conn.execute(
        f"INSERT INTO queue_counters (queue, {cols}) VALUES (:queue, {marks}) "
        f"ON CONFLICT (queue) DO UPDATE SET {sets}",
        {"queue": queue, **deltas},
    )


def _requeue(conn: sqlite3.Connection, queue: str, now: float) -> int:
    """Inside a write transaction: expired leases back to ready, counted as retried."""
    k = conn.execute(
        "UPDATE queue_messages SET state = 0 WHERE queue = ? AND state = 1 AND lease_until <= ?",
        (queue, now),
    ).rowcount
    _bump(conn, queue, ready=k, leased=-k, retried=k)
    return k


def _has_expired(conn: sqlite3.Connection, queue: str, now: float) -> bool:
    row = conn.execute(
        "SELECT 1 FROM queue_messages WHERE queue = ? AND state = 1 AND lease_until <= ? LIMIT 1",
        (queue, now),
    ).fetchone()
    return row is not None


def _params(queue: str, refs: list[Ref], **extra: Any) -> list[dict[str, Any]]:
    return [{"queue": queue, "num": r.num, "attempt": r.attempt, **extra} for r in refs]


class SqliteQueueBackend:
    """Queues in one SQLite file; ``url`` is ``sqlite:///path/queues.db``.

    ``clock`` (seconds since the epoch) stamps lease deadlines; tests pass a fake one.
    """

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.path = parse_backend_url(url, kinds=("sqlite",), what="SQLite queue",
                                      key="storage.queues").path
        self.clock = clock
        self._db = SqliteDB(self.path, schema=_SCHEMA, busy_timeout=busy_timeout,
                            name=f"SQLite queue file {self.path}")
        self._queues: dict[str, SqliteQueue] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"<SqliteQueueBackend {self.path}>"

    def queue(self, name: str) -> SqliteQueue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = SqliteQueue(check_name(name), self)
        return q

    async def names(self) -> list[str]:
        rows = await self.run("names", lambda c: c.execute("SELECT queue FROM queue_counters"))
        return sorted(r[0] for r in rows)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._db.close()

    async def run(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the backend's thread; an unreachable file raises
        BackendUnavailable, other SQLite errors become QueueError."""
        if self._closed:
            raise QueueError(f"SQLite queue backend {self.path}: {op} after close()")
        try:
            return await self._db.run(fn)
        except sqlite3.Error as exc:
            raise QueueError(
                f"SQLite queue file {self.path}: {op} failed: {exc} "
                "(check the path is writable and not on a network file system)"
            ) from exc

    async def push_multi(
        self, groups: Mapping[str, Sequence[tuple[dict[str, Any], int]]]
    ) -> dict[str, list[str]]:
        encoded = encode_groups(groups)
        if not encoded:
            return {}

        def push(conn: sqlite3.Connection) -> dict[str, list[str]]:
            with _write(conn):
                return {q: [str(n) for n in _insert(conn, q, rows)] for q, rows in encoded.items()}

        return await self.run(f"push to queues {', '.join(map(repr, encoded))}", push)


def _insert(conn: sqlite3.Connection, q: str, rows: list[tuple[str, int]]) -> list[int]:
    """Insert encoded rows into queue ``q`` (inside a write transaction); their ids."""
    conn.executemany(
        "INSERT INTO queue_messages (queue, state, priority, payload) VALUES (?, 0, ?, ?)",
        [(q, priority, data) for data, priority in rows],
    )
    # AUTOINCREMENT under the write lock: this batch's ids are consecutive.
    last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    _bump(conn, q, total=len(rows), ready=len(rows))
    return list(range(last - len(rows) + 1, last + 1))


class SqliteQueue(BaseQueue):
    """One named queue inside a :class:`SqliteQueueBackend` file."""

    def __init__(self, name: str, backend: SqliteQueueBackend) -> None:
        super().__init__(name)
        self.backend = backend

    async def _push(self, rows: list[tuple[str, int]]) -> list[int]:
        q = self.name

        def push(conn: sqlite3.Connection) -> list[int]:
            with _write(conn):
                return _insert(conn, q, rows)

        return await self.backend.run(f"push to queue {q!r}", push)

    async def _lease(self, n: int, timeout: float) -> list[Message]:
        q, clock = self.name, self.backend.clock

        def lease(conn: sqlite3.Connection) -> list[Message]:
            with _write(conn):
                now = clock()
                _requeue(conn, q, now)
                rows = conn.execute(
                    "SELECT id, payload, priority, attempts FROM queue_messages "
                    "WHERE queue = ? AND state = 0 ORDER BY priority DESC, id LIMIT ?",
                    (q, n),
                ).fetchall()
                if not rows:
                    return []
                until = now + timeout
                conn.executemany(
                    "UPDATE queue_messages SET state = 1, attempts = attempts + 1, "
                    "lease_until = ? WHERE id = ?",
                    [(until, r[0]) for r in rows],
                )
                _bump(conn, q, ready=-len(rows), leased=len(rows))
            return [message(num, data, prio, att + 1, until) for num, data, prio, att in rows]

        return await self.backend.run(f"lease from queue {q!r}", lease)

    async def _ack(self, refs: list[Ref]) -> int:
        q = self.name

        def ack(conn: sqlite3.Connection) -> int:
            with _write(conn):
                k = conn.executemany(
                    f"DELETE FROM queue_messages WHERE {_MATCH_LEASED}", _params(q, refs)
                ).rowcount
                _bump(conn, q, leased=-k, success=k)
            return k

        return await self.backend.run(f"ack on queue {q!r}", ack)

    async def _nack(self, refs: list[Ref], dead: bool) -> int:
        q = self.name

        def nack_ready(conn: sqlite3.Connection) -> int:
            with _write(conn):
                k = conn.executemany(
                    f"UPDATE queue_messages SET state = 0 WHERE {_MATCH_LEASED}", _params(q, refs)
                ).rowcount
                _bump(conn, q, leased=-k, ready=k, retried=k)
            return k

        def nack_dead(conn: sqlite3.Connection) -> int:
            with _write(conn):
                row = conn.execute("SELECT failed FROM queue_counters WHERE queue = ?", (q,))
                seq = (row.fetchone() or (0,))[0]
                k = 0
                for params in _params(q, refs):
                    # dead_seq orders dead letters by the time they died.
                    params["seq"] = seq + k + 1
                    k += conn.execute(
                        "UPDATE queue_messages SET state = 2, dead_seq = :seq "
                        f"WHERE {_MATCH_LEASED}",
                        params,
                    ).rowcount
                _bump(conn, q, leased=-k, dead=k, failed=k)
            return k

        return await self.backend.run(f"nack on queue {q!r}", nack_dead if dead else nack_ready)

    async def _extend(self, refs: list[Ref], timeout: float) -> int:
        q, clock = self.name, self.backend.clock

        def extend(conn: sqlite3.Connection) -> int:
            with _write(conn):
                until = clock() + timeout
                return int(
                    conn.executemany(
                        f"UPDATE queue_messages SET lease_until = :until WHERE {_MATCH_LEASED}",
                        _params(q, refs, until=until),
                    ).rowcount
                )

        return await self.backend.run(f"extend on queue {q!r}", extend)

    def _requeue_if_expired(self, conn: sqlite3.Connection) -> int:
        # A read probe first: length/stats stay read-only while no lease has expired.
        if not _has_expired(conn, self.name, self.backend.clock()):
            return 0
        with _write(conn):
            return _requeue(conn, self.name, self.backend.clock())

    async def _requeue_expired(self) -> int:
        return await self.backend.run(
            f"requeue expired leases of queue {self.name!r}", self._requeue_if_expired
        )

    async def _length(self) -> int:
        c = await self._counters()
        return c.ready + c.leased

    async def _counters(self) -> Counters:
        q = self.name

        def counters(conn: sqlite3.Connection) -> Counters:
            self._requeue_if_expired(conn)
            row = conn.execute(
                f"SELECT {', '.join(_COUNTER_NAMES)} FROM queue_counters WHERE queue = ?", (q,)
            ).fetchone()
            return Counters(*row) if row else Counters()

        return await self.backend.run(f"stats of queue {q!r}", counters)

    async def _dead_letters(self, n: int) -> list[Message]:
        q = self.name

        def dead_letters(conn: sqlite3.Connection) -> list[Message]:
            rows = conn.execute(
                "SELECT id, payload, priority, attempts FROM queue_messages "
                "WHERE queue = ? AND state = 2 ORDER BY dead_seq LIMIT ?",
                (q, n),
            ).fetchall()
            return [message(num, data, prio, att, 0.0) for num, data, prio, att in rows]

        return await self.backend.run(f"dead_letters of queue {q!r}", dead_letters)

    async def _purge(self) -> int:
        q = self.name

        def purge(conn: sqlite3.Connection) -> int:
            with _write(conn):
                k = conn.execute("DELETE FROM queue_messages WHERE queue = ?", (q,)).rowcount
                conn.execute("DELETE FROM queue_counters WHERE queue = ?", (q,))
            return int(k)

        return await self.backend.run(f"purge of queue {q!r}", purge)

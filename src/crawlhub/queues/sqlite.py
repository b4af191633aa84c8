"""The embedded queue backend: every named queue in one SQLite file (WAL mode).

One connection per backend lives on its own thread; each operation is one transaction
there. Writes take ``BEGIN IMMEDIATE``, so several processes may share the file safely.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from crawlhub.backends.backend import Backend
from crawlhub.backends.sqlite import SqliteDB
from crawlhub.backends.sqlite import immediate as _write
from crawlhub.core.errors import QueueError
from crawlhub.queues.common import (
    DEFAULT_MAX_ATTEMPTS,
    BaseQueue,
    QueueCounters,
    Ref,
    Row,
    check_queue_name,
    dead_kind,
    encode_groups,
    spent_reason,
)

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
CREATE TABLE IF NOT EXISTS queue_reasons (
    id INTEGER PRIMARY KEY,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS queue_limits (
    queue TEXT PRIMARY KEY,
    max_attempts INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS queue_dead_counts (
    queue TEXT NOT NULL,
    kind TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (queue, kind)
);
CREATE TABLE IF NOT EXISTS queue_pushed (
    mark TEXT PRIMARY KEY,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_pushed_at ON queue_pushed (at);
"""
# queue_reasons: why each dead letter died (by message id); queue_limits: the delivery
# limit an outbound configured; queue_dead_counts: messages ever dead-lettered, by kind.
# queue_pushed: marks a push_multi stored with its messages (the hub's task uuids), so a
# pusher that died before noting its push done can tell it happened (see push_multi).
# Tables of their own, so files made before them just gain them by CREATE IF NOT EXISTS.

#: Seconds a push mark is kept when its pusher does not forget it (it died).
MARK_KEEP = 86400.0

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


def _stored_limit(conn: sqlite3.Connection, queue: str) -> int | None:
    row = conn.execute("SELECT max_attempts FROM queue_limits WHERE queue = ?", (queue,))
    found = row.fetchone()
    return int(found[0]) if found else None


def _limit(conn: sqlite3.Connection, queue: str, given: int) -> int:
    """Inside a write transaction: the delivery limit in force. A configured one
    (``given`` > 0) is stored, so every process sharing the file applies it."""
    stored = _stored_limit(conn, queue)
    if given <= 0:
        return stored or DEFAULT_MAX_ATTEMPTS
    if stored != given:
        conn.execute(
            "INSERT INTO queue_limits (queue, max_attempts) VALUES (?, ?) "
            "ON CONFLICT (queue) DO UPDATE SET max_attempts = excluded.max_attempts",
            (queue, given),
        )
    return given


def _kill(conn: sqlite3.Connection, queue: str, dying: list[tuple[int, str]], kind: str
          ) -> int:
    """Inside a write transaction: leased messages ``(id, reason)`` to the dead letter,
    counted under ``kind`` (one of DEAD_KINDS)."""
    if not dying:
        return 0
    row = conn.execute("SELECT failed FROM queue_counters WHERE queue = ?", (queue,))
    seq = (row.fetchone() or (0,))[0]
    # dead_seq orders dead letters by the time they died.
    conn.executemany(
        "UPDATE queue_messages SET state = 2, dead_seq = ? WHERE id = ?",
        [(seq + i + 1, num) for i, (num, _) in enumerate(dying)],
    )
    conn.executemany("INSERT OR REPLACE INTO queue_reasons (id, reason) VALUES (?, ?)", dying)
    k = len(dying)
    _bump(conn, queue, leased=-k, dead=k, failed=k)
    conn.execute(
        "INSERT INTO queue_dead_counts (queue, kind, n) VALUES (?, ?, ?) "
        "ON CONFLICT (queue, kind) DO UPDATE SET n = n + excluded.n",
        (queue, kind, k),
    )
    return k


def _requeue(conn: sqlite3.Connection, queue: str, now: float, limit: int) -> int:
    """Inside a write transaction: end expired leases - back to ready (counted as
    retried), or to the dead letter once delivered ``limit`` times. Returns how many."""
    spent = conn.execute(
        "SELECT id, attempts FROM queue_messages WHERE queue = ? AND state = 1 "
        "AND lease_until <= ? AND attempts >= ? ORDER BY lease_until, id",  # as Redis does
        (queue, now, limit),
    ).fetchall()
    died = _kill(conn, queue, [(num, spent_reason(att)) for num, att in spent], "max_attempts")
    k = conn.execute(
        "UPDATE queue_messages SET state = 0 WHERE queue = ? AND state = 1 AND lease_until <= ?",
        (queue, now),
    ).rowcount
    _bump(conn, queue, ready=k, leased=-k, retried=k)
    return k + died


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
        url: str | Backend,
        *,
        busy_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = str(url)
        self.path = Backend.parse(url, kinds=("sqlite",), what="SQLite queue",
                                  key="storage.queues").path
        self.clock = clock
        self._db = SqliteDB(self.path, schema=_SCHEMA, busy_timeout=busy_timeout,
                            name=f"SQLite queue file {self.path}")
        self._queues: dict[str, SqliteQueue] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"<SqliteQueueBackend {self.path}>"

    def queue(self, name: str, *, max_attempts: int | None = None) -> SqliteQueue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = SqliteQueue(check_queue_name(name), self, max_attempts)
        else:
            q.configure(max_attempts)
        return q

    async def names(self) -> list[str]:
        rows = await self.run("names", lambda c: c.execute("SELECT queue FROM queue_counters"))
        return sorted(r[0] for r in rows)

    async def set_cache_kib(self, kib: int) -> None:
        """Bound the SQLite page cache of this store's connection (see SqliteDB)."""
        await self._db.set_cache_kib(kib)

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
        self, groups: Mapping[str, Sequence[tuple[dict[str, Any], int]]], *,
        marks: Sequence[str] = (), forget: Sequence[str] = (),
    ) -> dict[str, list[str]]:
        """Also stores ``marks`` (e.g. task uuids) in the same transaction, so whether
        this push happened can be asked later (:meth:`pushed`), and drops the marks in
        ``forget`` (the pusher no longer needs them); marks are kept a day at most."""
        encoded = encode_groups(groups)
        if not encoded:
            return {}
        limits = {q: self._queues[q].limit for q in encoded if q in self._queues}
        now = self.clock()

        def push(conn: sqlite3.Connection) -> dict[str, list[str]]:
            with _write(conn):
                ids = {q: [str(n) for n in _insert(conn, q, rows, limits.get(q, 0))]
                       for q, rows in encoded.items()}
                if marks or forget:
                    conn.executemany("DELETE FROM queue_pushed WHERE mark = ?",
                                     [(m,) for m in forget])
                    conn.executemany("INSERT OR REPLACE INTO queue_pushed (mark, at)"
                                     " VALUES (?, ?)", [(m, now) for m in marks])
                    conn.execute("DELETE FROM queue_pushed WHERE at < ?", (now - MARK_KEEP,))
                return ids

        return await self.run(f"push to queues {', '.join(map(repr, encoded))}", push)

    async def pushed(self, marks: Sequence[str]) -> set[str]:
        """Which of ``marks`` a :meth:`push_multi` stored (and nobody forgot)."""
        wanted = list(dict.fromkeys(marks))

        def read(conn: sqlite3.Connection) -> set[str]:
            found: set[str] = set()
            for start in range(0, len(wanted), 500):
                chunk = wanted[start:start + 500]
                found.update(m for (m,) in conn.execute(
                    "SELECT mark FROM queue_pushed WHERE mark IN"
                    f" ({','.join('?' * len(chunk))})", chunk))
            return found

        return await self.run("read push marks", read)


def _insert(conn: sqlite3.Connection, q: str, rows: list[tuple[str, int]], limit: int = 0
            ) -> list[int]:
    """Insert encoded rows into queue ``q`` (inside a write transaction); their ids.
    A configured delivery ``limit`` (> 0) is stored with the queue."""
    if limit > 0:
        _limit(conn, q, limit)
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

    def __init__(self, name: str, backend: SqliteQueueBackend,
                 max_attempts: int | None = None) -> None:
        super().__init__(name, max_attempts)
        self.backend = backend

    async def _push(self, rows: list[tuple[str, int]]) -> list[int]:
        q, limit = self.name, self.limit

        def push(conn: sqlite3.Connection) -> list[int]:
            with _write(conn):
                return _insert(conn, q, rows, limit)

        return await self.backend.run(f"push to queue {q!r}", push)

    async def _lease(self, n: int, timeout: float) -> list[Row]:
        q, clock, given = self.name, self.backend.clock, self.limit

        def lease(conn: sqlite3.Connection) -> list[Row]:
            with _write(conn):
                now = clock()
                _requeue(conn, q, now, _limit(conn, q, given))
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
            return [Row(num, data, prio, att + 1, until) for num, data, prio, att in rows]

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

    async def _nack(self, refs: list[Ref], dead: bool, reason: str | None) -> int:
        q, given = self.name, self.limit

        def nack(conn: sqlite3.Connection) -> int:
            with _write(conn):
                held: list[tuple[int, int]] = []
                for params in _params(q, refs):
                    row = conn.execute(
                        f"SELECT id, attempts FROM queue_messages WHERE {_MATCH_LEASED}", params
                    ).fetchone()
                    if row is not None:
                        held.append((row[0], row[1]))
                if dead:
                    return _kill(conn, q, [(num, reason or "") for num, _ in held],
                                 dead_kind(reason))
                limit = _limit(conn, q, given)
                last = f"; last nack: {reason}" if reason else ""
                died = _kill(conn, q, [(num, spent_reason(att) + last)
                                       for num, att in held if att >= limit], "max_attempts")
                back = [(num,) for num, att in held if att < limit]
                conn.executemany("UPDATE queue_messages SET state = 0 WHERE id = ?", back)
                _bump(conn, q, leased=-len(back), ready=len(back), retried=len(back))
            return died + len(back)

        return await self.backend.run(f"nack on queue {q!r}", nack)

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
            limit = _limit(conn, self.name, self.limit)
            return _requeue(conn, self.name, self.backend.clock(), limit)

    async def _requeue_expired(self, everything: bool = False) -> int:
        if not everything:
            return await self.backend.run(
                f"requeue expired leases of queue {self.name!r}", self._requeue_if_expired
            )

        def requeue_all(conn: sqlite3.Connection) -> int:
            with _write(conn):
                return _requeue(conn, self.name, math.inf, _limit(conn, self.name, self.limit))

        return await self.backend.run(f"requeue the leases of queue {self.name!r}", requeue_all)

    async def _length(self) -> int:
        c = await self._counters()
        return c.ready + c.leased

    async def _counters(self) -> QueueCounters:
        q = self.name

        def counters(conn: sqlite3.Connection) -> QueueCounters:
            self._requeue_if_expired(conn)
            row = conn.execute(
                f"SELECT {', '.join(_COUNTER_NAMES)} FROM queue_counters WHERE queue = ?", (q,)
            ).fetchone()
            c = QueueCounters(*row) if row else QueueCounters()
            c.max_attempts = self.limit or _stored_limit(conn, q) or DEFAULT_MAX_ATTEMPTS
            kinds = dict(conn.execute(
                "SELECT kind, n FROM queue_dead_counts WHERE queue = ?", (q,)).fetchall())
            c.failed_max_attempts = kinds.get("max_attempts", 0)
            c.failed_undeliverable = kinds.get("undeliverable", 0)
            c.failed_nacked = kinds.get("nacked", 0)
            return c

        return await self.backend.run(f"stats of queue {q!r}", counters)

    async def _dead_letters(self, n: int) -> list[Row]:
        q = self.name

        def dead_letters(conn: sqlite3.Connection) -> list[Row]:
            rows = conn.execute(
                "SELECT m.id, m.payload, m.priority, m.attempts, r.reason FROM queue_messages m "
                "LEFT JOIN queue_reasons r ON r.id = m.id "
                "WHERE m.queue = ? AND m.state = 2 ORDER BY m.dead_seq LIMIT ?",
                (q, n),
            ).fetchall()
            return [Row(num, data, prio, att, 0.0, why or None)
                    for num, data, prio, att, why in rows]

        return await self.backend.run(f"dead_letters of queue {q!r}", dead_letters)

    async def _purge(self) -> int:
        q = self.name

        def purge(conn: sqlite3.Connection) -> int:
            with _write(conn):
                conn.execute(
                    "DELETE FROM queue_reasons WHERE id IN "
                    "(SELECT id FROM queue_messages WHERE queue = ? AND state = 2)", (q,)
                )
                k = conn.execute("DELETE FROM queue_messages WHERE queue = ?", (q,)).rowcount
                conn.execute("DELETE FROM queue_counters WHERE queue = ?", (q,))
                conn.execute("DELETE FROM queue_limits WHERE queue = ?", (q,))
                conn.execute("DELETE FROM queue_dead_counts WHERE queue = ?", (q,))
            return int(k)

        return await self.backend.run(f"purge of queue {q!r}", purge)

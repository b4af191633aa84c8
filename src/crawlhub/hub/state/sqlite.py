"""Hub state in one SQLite file (embedded mode): ledger, counters, leases, token buckets
and dispatch rates in one transaction per step."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from crawlhub.backends.backend import Backend
from crawlhub.backends.sqlite import SqliteDB
from crawlhub.core.clock import Clock, system_clock
from crawlhub.hub.state.base import (
    CLAIM_LEASE,
    DEFAULT_RETENTION,
    RATE_KEEP,
    LedgerEntry,
    Settle,
    _bucket,
    _dumps,
    _loads,
    _text,
)
from crawlhub.hub.state.intake import INTAKE_SCHEMA, SqliteIntake
from crawlhub.hub.state.intake.sqlite import select_in


def _add_counters(conn: sqlite3.Connection, items: Sequence[tuple[str, str, int]]) -> None:
    if items:
        conn.executemany(
            "INSERT INTO counters(outbound, field, value) VALUES (?, ?, ?)"
            " ON CONFLICT(outbound, field) DO UPDATE SET value = value + excluded.value",
            list(items),
        )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    task_uuid TEXT PRIMARY KEY,
    entry TEXT NOT NULL,
    deadline REAL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_deadline ON ledger(deadline) WHERE deadline IS NOT NULL;
CREATE INDEX IF NOT EXISTS ledger_expires ON ledger(expires);
CREATE TABLE IF NOT EXISTS counters (
    outbound TEXT NOT NULL,
    field TEXT NOT NULL,
    value INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (outbound, field)
);
CREATE TABLE IF NOT EXISTS tokens (
    scope TEXT PRIMARY KEY,
    tokens REAL NOT NULL,
    stamp REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    task_uuid TEXT PRIMARY KEY,
    until REAL NOT NULL,
    pending TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_until ON leases(until);
CREATE TABLE IF NOT EXISTS rates (
    outbound TEXT NOT NULL,
    second INTEGER NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (outbound, second)
);
"""


class SqliteHubState(SqliteIntake):
    """Hub state in one SQLite file (embedded mode)."""

    def __init__(self, url: str | Backend, *, retention: float = DEFAULT_RETENTION,
                 clock: Clock = system_clock) -> None:
        self.url = str(url)
        self.retention = retention
        #: Epoch seconds for retention and token buckets; tests pass a fake one.
        self.clock = clock
        self._db = SqliteDB(url, schema=_SCHEMA + INTAKE_SCHEMA)
        self._last_purge = 0.0

    async def record(self, entries: Sequence[LedgerEntry],
                     counters: Sequence[tuple[str, str, int]] = ()) -> None:
        now = self.clock()
        rows = [
            (e.task["task_uuid"], _dumps(e), e.deadline, now + self.retention) for e in entries
        ]

        def _write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT OR REPLACE INTO ledger(task_uuid, entry, deadline, expires)"
                " VALUES (?, ?, ?, ?)",
                rows,
            )
            _add_counters(conn, counters)

        await self._db.transaction(_write)

    async def get(self, task_uuid: str) -> LedgerEntry | None:
        def _get(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT entry FROM ledger WHERE task_uuid = ?", (task_uuid,)
            ).fetchone()
            return row[0] if row else None

        raw = await self._db.run(_get)
        return _loads(raw) if raw else None

    async def resolve(self, task_uuid: str) -> LedgerEntry | None:
        def _pop(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "DELETE FROM ledger WHERE task_uuid = ? RETURNING entry", (task_uuid,)
            ).fetchone()
            return row[0] if row else None

        raw = await self._db.transaction(_pop)
        return _loads(raw) if raw else None

    async def claim_expired(self, now: float, limit: int = 500, *,
                            lease: float = CLAIM_LEASE) -> list[LedgerEntry]:
        purge = now - self._last_purge > 60
        if purge:
            self._last_purge = now
        until = now + lease

        def _claim(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            if purge:
                conn.execute("DELETE FROM ledger WHERE deadline IS NULL AND expires < ?"
                             " AND task_uuid NOT IN (SELECT task_uuid FROM leases)", (now,))
            # Leases that ended unsettled first, so that those just taken are not retaken.
            due = conn.execute(
                "SELECT l.task_uuid, l.pending, g.entry FROM leases AS l LEFT JOIN ledger AS g"
                " ON g.task_uuid = l.task_uuid WHERE l.until <= ? ORDER BY l.until LIMIT ?",
                (now, limit),
            ).fetchall()
            conn.executemany("DELETE FROM leases WHERE task_uuid = ?",
                             [(u,) for u, _, raw in due if raw is None])
            out = [(raw, pending) for _, pending, raw in due if raw is not None]
            lost = conn.execute(
                "SELECT task_uuid, entry FROM ledger WHERE deadline IS NOT NULL"
                " AND deadline <= ? ORDER BY deadline LIMIT ?", (now, limit),
            ).fetchall()
            conn.executemany("UPDATE ledger SET deadline = NULL WHERE task_uuid = ?",
                             [(u,) for u, _ in lost])
            out += [(raw, "timeout") for _, raw in lost]
            conn.executemany(
                "INSERT OR REPLACE INTO leases(task_uuid, until, pending) VALUES (?, ?, ?)",
                [(u, until, pending) for u, pending, raw in due if raw is not None]
                + [(u, until, "timeout") for u, _ in lost])
            return out

        return [_loads(raw, pending) for raw, pending in await self._db.transaction(_claim)]

    async def end_leases(self, now: float) -> int:
        def _end(conn: sqlite3.Connection) -> int:
            return int(conn.execute("UPDATE leases SET until = ? WHERE until > ?",
                                    (now, now)).rowcount)

        return await self._db.transaction(_end)  # type: ignore[no-any-return]

    async def get_many(self, task_uuids: Sequence[str]) -> dict[str, LedgerEntry]:
        uuids = list(dict.fromkeys(task_uuids))

        def _get(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            return select_in(conn, "SELECT task_uuid, entry FROM ledger WHERE task_uuid"
                             " IN ({})", uuids)

        return {uuid: _loads(raw) for uuid, raw in await self._db.run(_get)}

    async def settle(self, current: LedgerEntry, after: LedgerEntry | None,
                     counters: Sequence[tuple[str, str, int]] = (), *,
                     lease_until: float = 0.0) -> bool:
        [done] = await self.settle_many([Settle(current, after, counters, lease_until)])
        return done

    async def settle_many(self, items: Sequence[Settle]) -> list[bool]:
        """One transaction for the whole batch; each item checked against what its
        caller read, applied or skipped on its own."""
        expires = self.clock() + self.retention
        steps = []
        for item in items:
            current, after = item.current, item.after
            if current.raw is None:
                raise ValueError("settle needs an entry read from the ledger"
                                 " (get/claim_expired)")
            raw = None if after is None else _text(after.raw) or _dumps(after)
            steps.append((str(current.task["task_uuid"]), _text(current.raw), after, raw,
                          item))

        def _settle(conn: sqlite3.Connection) -> list[bool]:
            done: list[bool] = []
            counters: dict[tuple[str, str], int] = {}
            for uuid, expected, after, raw, item in steps:
                row = conn.execute("SELECT entry FROM ledger WHERE task_uuid = ?",
                                   (uuid,)).fetchone()
                if row is None or row[0] != expected:
                    done.append(False)
                    continue
                # Settled means pushed: the intake has no push of it left to redo.
                conn.execute("DELETE FROM unpushed WHERE task_uuid = ?", (uuid,))
                if after is None:
                    conn.execute("DELETE FROM ledger WHERE task_uuid = ?", (uuid,))
                    conn.execute("DELETE FROM leases WHERE task_uuid = ?", (uuid,))
                elif after.pending:
                    conn.execute("UPDATE ledger SET entry = ?, deadline = NULL, expires = ?"
                                 " WHERE task_uuid = ?", (raw, expires, uuid))
                    conn.execute("INSERT OR REPLACE INTO leases(task_uuid, until, pending)"
                                 " VALUES (?, ?, ?)", (uuid, item.lease_until, after.pending))
                else:
                    conn.execute("UPDATE ledger SET entry = ?, deadline = ?, expires = ?"
                                 " WHERE task_uuid = ?", (raw, after.deadline, expires, uuid))
                    conn.execute("DELETE FROM leases WHERE task_uuid = ?", (uuid,))
                for outbound, field, n in item.counters:
                    counters[outbound, field] = counters.get((outbound, field), 0) + n
                done.append(True)
            _add_counters(conn, [(o, f, n) for (o, f), n in counters.items()])
            return done

        done = await self._db.transaction(_settle) if steps else []
        for (_, _, after, raw, _), ok in zip(steps, done, strict=True):
            if ok and after is not None:
                after.raw = raw
        return done

    async def note_dispatched(self, counts: Sequence[tuple[str, int, int]]) -> None:
        if not counts:
            return
        oldest = max(second for _, second, _ in counts) - RATE_KEEP

        def _note(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO rates(outbound, second, n) VALUES (?, ?, ?)"
                " ON CONFLICT(outbound, second) DO UPDATE SET n = n + excluded.n",
                list(counts))
            conn.execute("DELETE FROM rates WHERE second < ?", (oldest,))

        await self._db.transaction(_note)

    async def dispatched_in(self, first: int, last: int) -> dict[str, int]:
        def _read(conn: sqlite3.Connection) -> list[tuple[str, int]]:
            return conn.execute("SELECT outbound, SUM(n) FROM rates WHERE second BETWEEN"
                                " ? AND ? GROUP BY outbound", (first, last)).fetchall()

        return {outbound: int(n) for outbound, n in await self._db.run(_read)}

    async def incr(self, outbound: str, field: str, n: int = 1) -> None:
        await self.incr_many([(outbound, field, n)])

    async def incr_many(self, items: Sequence[tuple[str, str, int]]) -> None:
        if not items:
            return

        await self._db.transaction(lambda conn: _add_counters(conn, items))

    async def counters(self) -> dict[str, dict[str, int]]:
        def _read(conn: sqlite3.Connection) -> list[tuple[str, str, int]]:
            return conn.execute("SELECT outbound, field, value FROM counters").fetchall()

        result: dict[str, dict[str, int]] = {}
        for outbound, field, value in await self._db.run(_read):
            result.setdefault(outbound, {})[field] = int(value)
        return result

    async def take_tokens(self, scope: str, rate: float, n: int, burst: float) -> float:
        now = self.clock()

        def _take(conn: sqlite3.Connection) -> float:
            row = conn.execute("SELECT tokens, stamp FROM tokens WHERE scope = ?",
                               (scope,)).fetchone()
            tokens, stamp = (row[0], row[1]) if row else (burst, now)
            left, wait = _bucket(tokens, stamp, now, rate, n, burst)
            conn.execute(
                "INSERT OR REPLACE INTO tokens(scope, tokens, stamp) VALUES (?, ?, ?)",
                (scope, left, now),
            )
            return wait

        return await self._db.transaction(_take)

    async def pending(self) -> int:
        def _count(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])

        return await self._db.run(_count)

    async def set_cache_kib(self, kib: int) -> None:
        """Bound the SQLite page cache of this store's connection (see SqliteDB)."""
        await self._db.set_cache_kib(kib)

    async def close(self) -> None:
        await self._db.close()

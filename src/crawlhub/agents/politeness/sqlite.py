"""The domain gate's store in a SQLite file (embedded mode): slots, pace and robots.txt in
three tables, one ``BEGIN IMMEDIATE`` transaction per call, so agent processes on one
machine sharing the file see one gate."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from crawlhub.agents.politeness.adaptive import AdaptiveState, step
from crawlhub.agents.politeness.base import (
    DomainFigures,
    DomainRules,
    Grant,
    Release,
    RobotsEntry,
)
from crawlhub.backends.backend import Backend
from crawlhub.backends.sqlite import SqliteDB

_SCHEMA = """
CREATE TABLE IF NOT EXISTS gate_slots (
    domain TEXT NOT NULL,
    slot TEXT NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (domain, slot)
);
CREATE INDEX IF NOT EXISTS gate_slots_expires ON gate_slots(domain, expires);
CREATE TABLE IF NOT EXISTS gate_pace (
    domain TEXT PRIMARY KEY,
    next REAL NOT NULL DEFAULT 0,
    backoff REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS gate_adapt (
    domain TEXT PRIMARY KEY,
    lim REAL NOT NULL,
    delay REAL NOT NULL,
    latency REAL NOT NULL,
    base REAL NOT NULL,
    error_rate REAL NOT NULL,
    cut REAL NOT NULL,
    slow_start INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS gate_adapt_updated ON gate_adapt(updated);
CREATE TABLE IF NOT EXISTS gate_robots (
    origin TEXT PRIMARY KEY,
    status INTEGER,
    body BLOB,
    expires REAL NOT NULL DEFAULT 0,
    claim REAL NOT NULL DEFAULT 0
)
"""


class SqliteGateStore:
    """:class:`~crawlhub.agents.politeness.base.GateStore` on one SQLite file."""

    def __init__(self, url: str | Backend) -> None:
        self.url = str(url)
        self._db = SqliteDB(url, schema=_SCHEMA, name=f"domain gate {url}")

    async def acquire(self, domain: str, n: int, now: float, rules: DomainRules,
                      token: str) -> Grant:
        def _acquire(conn: sqlite3.Connection) -> Grant:
            conn.execute("DELETE FROM gate_slots WHERE domain = ? AND expires <= ?",
                         (domain, now))
            pace = conn.execute("SELECT next, backoff FROM gate_pace WHERE domain = ?",
                                (domain,)).fetchone()
            ready = max(pace) if pace else 0.0
            if ready > now:
                return Grant([], ready - now, "pace")
            concurrency, delay = rules.concurrency, rules.delay
            if rules.adaptive:
                row = conn.execute("SELECT lim, delay FROM gate_adapt WHERE domain = ?",
                                   (domain,)).fetchone()
                limit = row[0] if row else min(rules.start, rules.concurrency)
                concurrency = max(1, min(concurrency, int(limit)))
                delay = max(delay, row[1] if row else 0.0)
            held, first = conn.execute("SELECT COUNT(*), MIN(expires) FROM gate_slots"
                                       " WHERE domain = ?", (domain,)).fetchone()
            if held >= concurrency:
                return Grant([], float(first) - now, "full")
            k = 1 if delay > 0 else min(n, concurrency - held)
            ids = [f"{token}:{i}" for i in range(k)]
            conn.executemany("INSERT OR REPLACE INTO gate_slots(domain, slot, expires)"
                             " VALUES (?, ?, ?)", [(domain, i, now + rules.lease) for i in ids])
            if delay > 0:
                conn.execute("INSERT INTO gate_pace(domain, next) VALUES (?, ?)"
                             " ON CONFLICT(domain) DO UPDATE SET next = excluded.next",
                             (domain, now + delay))
            return Grant(ids)

        return await self._db.transaction(_acquire)

    async def release(self, releases: Sequence[Release], now: float) -> None:
        if not releases:
            return

        def _release(conn: sqlite3.Connection) -> None:
            conn.executemany("DELETE FROM gate_slots WHERE domain = ? AND slot = ?",
                             [(r.domain, r.slot) for r in releases])
            conn.executemany(
                "INSERT INTO gate_pace(domain, backoff) VALUES (?, ?) ON CONFLICT(domain)"
                " DO UPDATE SET backoff = MAX(backoff, excluded.backoff)",
                [(r.domain, r.backoff_until) for r in releases if r.backoff_until])
            for r in releases:
                if r.feedback is not None and r.rules is not None and r.rules.adaptive:
                    _adapt(conn, r, now)
            # Pace rows of domains idle for a while serve nobody.
            conn.execute("DELETE FROM gate_pace WHERE next < ? AND backoff < ?",
                         (now - 3600, now - 3600))

        await self._db.transaction(_release)

    async def extend(self, slots: Sequence[tuple[str, str, float]], now: float) -> int:
        if not slots:
            return 0

        def _extend(conn: sqlite3.Connection) -> int:
            return sum(conn.execute("UPDATE gate_slots SET expires = ? WHERE domain = ?"
                                    " AND slot = ? AND expires > ?",
                                    (until, domain, slot, now)).rowcount
                       for domain, slot, until in slots)

        return await self._db.transaction(_extend)

    async def reset(self) -> None:
        def _reset(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM gate_slots")
            conn.execute("DELETE FROM gate_pace")
            conn.execute("UPDATE gate_robots SET claim = 0 WHERE claim > 0")

        await self._db.transaction(_reset)

    async def held(self, domain: str, now: float) -> int:
        def _held(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT COUNT(*) FROM gate_slots WHERE domain = ?"
                                    " AND expires > ?", (domain, now)).fetchone()[0])

        return await self._db.run(_held)

    async def figures(self, now: float, limit: int = 100) -> list[DomainFigures]:
        def _figures(conn: sqlite3.Connection) -> list[DomainFigures]:
            rows = conn.execute(
                "SELECT a.domain, lim, delay, latency, base, error_rate, ok, errors,"
                " updated, (SELECT COUNT(*) FROM gate_slots s WHERE s.domain = a.domain"
                " AND s.expires > ?), COALESCE((SELECT backoff FROM gate_pace p"
                " WHERE p.domain = a.domain), 0) FROM gate_adapt a"
                " ORDER BY updated DESC LIMIT ?", (now, limit)).fetchall()
            return [DomainFigures(d, lim, delay, lat, base, err, ok, errors, held,
                                  max(0.0, backoff - now), updated)
                    for d, lim, delay, lat, base, err, ok, errors, updated, held, backoff
                    in rows]

        return await self._db.run(_figures)

    async def robots_get(self, origin: str) -> RobotsEntry | None:
        def _get(conn: sqlite3.Connection) -> tuple[int | None, bytes | None, float] | None:
            return conn.execute("SELECT status, body, expires FROM gate_robots"
                                " WHERE origin = ?", (origin,)).fetchone()

        row = await self._db.run(_get)
        if row is None or row[0] is None:
            return None
        return RobotsEntry(status=int(row[0]), body=bytes(row[1] or b""), expires=row[2])

    async def robots_claim(self, origin: str, now: float, until: float) -> bool:
        def _claim(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT status, expires, claim FROM gate_robots"
                               " WHERE origin = ?", (origin,)).fetchone()
            if row is not None and ((row[0] is not None and row[1] > now) or row[2] > now):
                return False
            conn.execute("INSERT INTO gate_robots(origin, claim) VALUES (?, ?)"
                         " ON CONFLICT(origin) DO UPDATE SET claim = excluded.claim",
                         (origin, until))
            return True

        return await self._db.transaction(_claim)

    async def robots_put(self, origin: str, entry: RobotsEntry, now: float) -> None:
        await self._db.transaction(lambda conn: conn.execute(
            "INSERT OR REPLACE INTO gate_robots(origin, status, body, expires, claim)"
            " VALUES (?, ?, ?, ?, 0)", (origin, entry.status, entry.body, entry.expires)))

    async def close(self) -> None:
        await self._db.close()


def _adapt(conn: sqlite3.Connection, r: Release, now: float) -> None:
    """One answer's step (:func:`.adaptive.step`) on its domain's row, in the caller's
    transaction."""
    assert r.feedback is not None and r.rules is not None
    rules = r.rules
    row = conn.execute("SELECT lim, delay, latency, base, error_rate, cut, slow_start, ok,"
                       " errors, updated FROM gate_adapt WHERE domain = ?",
                       (r.domain,)).fetchone()
    s = step(AdaptiveState(*row) if row else None, r.feedback, now,
             target=rules.concurrency, start=rules.start, tolerance=rules.tolerance,
             floor=rules.delay, max_delay=rules.max_delay)
    conn.execute("INSERT OR REPLACE INTO gate_adapt(domain, lim, delay, latency, base,"
                 " error_rate, cut, slow_start, ok, errors, updated)"
                 " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (r.domain, s.limit, s.delay, s.latency, s.base, s.error_rate, s.cut,
                  s.slow_start, s.ok, s.errors, s.updated))

"""The embedded seed store: one SQLite table per frontier plus in-process bloom filters.

The table is the write-ahead log of the filters: an admission commits its (segment,
key) row before ``admit`` returns, and a filter snapshot records the last row it
covers, so a restart loads the snapshot and replays the rows after it; a kill -9
between snapshots loses no admission. The unique (segment, key) index is the final
arbiter: a filter that misses a key (another process admitted it) costs one insert
that the index ignores, never a second admission. All work runs on the database's own
thread, which also keeps the filters' CPU time off the event loop.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from crawlhub.errors import FrontierError
from crawlhub.frontier.bloom import ScalableBloom, load_snapshot, save_snapshot, stable_hash
from crawlhub.frontier.seed import Outcome, Seed
from crawlhub.frontier.store import Entry, SegmentCounts, check_entries
from crawlhub.sqlitedb import SqliteDB

PENDING, LEASED, DONE, FAILED, DISPATCHED, WAITING = 0, 1, 2, 3, 4, 5
_STATE_NAMES = {
    PENDING: "pending",
    WAITING: "pending",
    LEASED: "leased",
    DONE: "done",
    FAILED: "failed",
    DISPATCHED: "dispatched",
}
_FINAL = {"ok": DONE, "failed": FAILED}
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,100}")

# Random-order inserts into the (segment, key) index dirty many pages per transaction:
# a larger page cache and rarer WAL checkpoints halve the cost at a million seeds.
_SCHEMA = """
PRAGMA cache_size = -65536;
PRAGMA wal_autocheckpoint = 10000;
CREATE TABLE IF NOT EXISTS "{t}" (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    segment INTEGER NOT NULL,
    key TEXT NOT NULL,
    state INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    ready_at REAL NOT NULL,
    lease_until REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    seed TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS "{t}:key" ON "{t}" (segment, key);
CREATE INDEX IF NOT EXISTS "{t}:ready" ON "{t}" (priority DESC, seq) WHERE state = 0;
CREATE INDEX IF NOT EXISTS "{t}:waiting" ON "{t}" (ready_at) WHERE state = 5;
CREATE INDEX IF NOT EXISTS "{t}:leased" ON "{t}" (lease_until) WHERE state = 1;
CREATE INDEX IF NOT EXISTS "{t}:state" ON "{t}" (segment, state);
CREATE TABLE IF NOT EXISTS "{t}:segments" (
    segment INTEGER PRIMARY KEY,
    duplicates INTEGER NOT NULL DEFAULT 0
);
"""


def check_frontier_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FrontierError(
            f"frontier name {name!r} is invalid: use 1-100 letters, digits, '_', '.' or '-'"
        )
    return name


class SqliteSeedStore:
    """Seeds of frontier ``name`` in the SQLite file ``url``; filters snapshot beside it
    in ``<file>-bloom/<name>/``."""

    def __init__(self, url: str, name: str, *, expected_items: int, fp_rate: float) -> None:
        self.name = check_frontier_name(name)
        self.url = url
        self.expected_items = expected_items
        self.fp_rate = fp_rate
        self._t = f"frontier:{name}"
        self.db = SqliteDB(url, schema=_SCHEMA.format(t=self._t))
        self.snapshot_dir = Path(f"{self.db.path}-bloom") / name
        # Touched only on the database thread:
        self._blooms: dict[int, ScalableBloom] = {}
        self._duplicates: dict[int, int] = defaultdict(int)
        self._max_seq = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"<SqliteSeedStore {self.name!r} at {self.db.path}>"

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        await self.db.run(self._restore)

    def _restore(self, conn: sqlite3.Connection) -> None:
        blooms, watermark = load_snapshot(self.snapshot_dir)
        replay = conn.execute(
            f'SELECT seq, segment, key FROM "{self._t}" WHERE seq > ? ORDER BY seq', (watermark,)
        )
        max_seq = watermark
        for seq, segment, key in replay:
            bloom = blooms.get(segment)
            if bloom is not None:
                bloom.add(stable_hash(key))
            max_seq = seq
        self._blooms = blooms
        self._max_seq = max_seq

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.db.close()

    # ------------------------------------------------------------------ filters
    def _bloom(self, conn: sqlite3.Connection, segment: int) -> ScalableBloom:
        bloom = self._blooms.get(segment)
        if bloom is None:
            # Not in the snapshot (new, freed or lost): rebuild from the rows, which
            # hold every key the segment admitted.
            bloom = ScalableBloom(self.expected_items, self.fp_rate)
            for (key,) in conn.execute(
                f'SELECT key FROM "{self._t}" WHERE segment = ?', (segment,)
            ):
                bloom.add(stable_hash(key))
            self._blooms[segment] = bloom
        return bloom

    async def snapshot(self, current_segment: int) -> None:
        await self.db.run(lambda conn: self._snapshot(conn, current_segment))

    def _snapshot(self, conn: sqlite3.Connection, current_segment: int) -> None:
        self._flush_duplicates(conn)
        for segment in [s for s in self._blooms if s < current_segment]:
            del self._blooms[segment]
        save_snapshot(self.snapshot_dir, self._blooms, self._max_seq)

    def _flush_duplicates(self, conn: sqlite3.Connection) -> None:
        if not self._duplicates:
            return
        rows = list(self._duplicates.items())
        self._duplicates.clear()
        conn.executemany(
            f'INSERT INTO "{self._t}:segments" (segment, duplicates) VALUES (?, ?) '
            "ON CONFLICT (segment) DO UPDATE SET duplicates = duplicates + excluded.duplicates",
            rows,
        )

    async def filter_bytes(self) -> int:
        return await self.db.run(lambda _: sum(b.nbytes for b in self._blooms.values()))

    # ------------------------------------------------------------------ admission
    async def admit(self, entries: Sequence[Entry], now: float, *, exact: bool) -> list[bool]:
        check_entries(entries)
        if not entries:
            return []
        return await self.db.run(lambda conn: self._admit(conn, entries, now, exact))

    def _admit(
        self, conn: sqlite3.Connection, entries: Sequence[Entry], now: float, exact: bool
    ) -> list[bool]:
        results = [False] * len(entries)
        duplicates: dict[int, int] = defaultdict(int)
        candidates: dict[tuple[int, str], int] = {}  # (segment, key) -> index in entries
        exists = f'SELECT 1 FROM "{self._t}" WHERE segment = ? AND key = ?'
        conn.execute("BEGIN IMMEDIATE")
        try:
            for i, e in enumerate(entries):
                ident = (e.segment, e.key)
                if ident in candidates or (
                    e.hash in self._bloom(conn, e.segment)
                    and (not exact or conn.execute(exists, ident).fetchone() is not None)
                ):
                    duplicates[e.segment] += 1
                else:
                    candidates[ident] = i
            inserted = self._insert(conn, [entries[i] for i in candidates.values()], now)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        for ident, i in candidates.items():
            if ident in inserted:
                results[i] = True
            else:  # another process admitted it; our filter had not seen it yet
                duplicates[ident[0]] += 1
            # Only committed keys enter the filters: a rolled-back key stays admissible.
            self._blooms[ident[0]].add(entries[i].hash)
        for segment, n in duplicates.items():
            self._duplicates[segment] += n
        return results

    def _insert(
        self, conn: sqlite3.Connection, entries: list[Entry], now: float
    ) -> set[tuple[int, str]]:
        """INSERT OR IGNORE many rows in one statement; the (segment, key) inserted."""
        inserted: set[tuple[int, str]] = set()
        for start in range(0, len(entries), 4000):
            chunk = entries[start : start + 4000]
            values: list[object] = []
            for e in chunk:
                if e.dispatched:
                    state = DISPATCHED
                else:
                    state = PENDING if e.ready_at <= now else WAITING
                values += (e.segment, e.key, state, e.seed.priority, e.ready_at, e.seed.encode())
            rows = conn.execute(
                f'INSERT OR IGNORE INTO "{self._t}" '
                "(segment, key, state, priority, ready_at, seed) VALUES "
                + ",".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk))
                + " RETURNING seq, segment, key",
                values,
            ).fetchall()
            for seq, segment, key in rows:
                inserted.add((segment, key))
                self._max_seq = max(self._max_seq, seq)
        return inserted

    # ------------------------------------------------------------------ dispatch
    def _sweep(self, conn: sqlite3.Connection, now: float) -> None:
        """Waiting seeds whose time came and expired leases become pending."""
        conn.execute(
            f'UPDATE "{self._t}" SET state = {PENDING} WHERE state = {WAITING} AND ready_at <= ?',
            (now,),
        )
        conn.execute(
            f'UPDATE "{self._t}" SET state = {PENDING}, lease_until = NULL '
            f"WHERE state = {LEASED} AND lease_until <= ?",
            (now,),
        )

    async def claim(self, n: int, now: float, lease_until: float) -> list[Seed]:
        def run(conn: sqlite3.Connection) -> list[Seed]:
            self._sweep(conn, now)
            rows = conn.execute(
                f'UPDATE "{self._t}" SET state = {LEASED}, lease_until = ?, '
                "attempts = attempts + 1 WHERE seq IN ("
                f'SELECT seq FROM "{self._t}" WHERE state = {PENDING} '
                "ORDER BY priority DESC, seq LIMIT ?) "
                "RETURNING seq, priority, segment, key, attempts, seed",
                (lease_until, n),
            ).fetchall()
            rows.sort(key=lambda r: (-r[1], r[0]))
            return [
                Seed.decode(r[5], key=r[3], segment=r[2], attempts=r[4], lease_until=lease_until)
                for r in rows
            ]

        return await self.db.transaction(run)

    async def extend(self, seeds: Sequence[Seed], lease_until: float) -> list[bool]:
        def run(conn: sqlite3.Connection) -> list[bool]:
            return [
                conn.execute(
                    f'UPDATE "{self._t}" SET lease_until = ? '
                    f"WHERE segment = ? AND key = ? AND state = {LEASED}",
                    (lease_until, s.segment, s.key),
                ).rowcount
                == 1
                for s in seeds
            ]

        return await self.db.transaction(run)

    async def release(self, seeds: Sequence[Seed]) -> int:
        def run(conn: sqlite3.Connection) -> int:
            return sum(
                conn.execute(
                    f'UPDATE "{self._t}" SET state = {PENDING}, lease_until = NULL, '
                    f"attempts = max(attempts - 1, 0) "
                    f"WHERE segment = ? AND key = ? AND state = {LEASED}",
                    (s.segment, s.key),
                ).rowcount
                for s in seeds
            )

        return await self.db.transaction(run)

    async def finish(
        self, segment: int, key: str, outcome: Outcome, now: float, ready_at: float
    ) -> bool:
        if outcome == "retry":
            state = PENDING if ready_at <= now else WAITING
        else:
            state = _FINAL[outcome]

        def run(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                f'UPDATE "{self._t}" SET state = ?, lease_until = NULL, ready_at = '
                "CASE WHEN ? THEN ? ELSE ready_at END "
                f"WHERE segment = ? AND key = ? AND state IN ({PENDING}, {WAITING}, {LEASED})",
                (state, outcome == "retry", ready_at, segment, key),
            )
            return cur.rowcount == 1

        return await self.db.transaction(run)

    async def next_due(self, now: float) -> float | None:
        def run(conn: sqlite3.Connection) -> float | None:
            if conn.execute(
                f'SELECT 1 FROM "{self._t}" WHERE state = {PENDING} LIMIT 1'
            ).fetchone():
                return now
            times = [
                conn.execute(f'SELECT min(ready_at) FROM "{self._t}" WHERE state = {WAITING}')
                .fetchone()[0],
                conn.execute(f'SELECT min(lease_until) FROM "{self._t}" WHERE state = {LEASED}')
                .fetchone()[0],
            ]
            due = [t for t in times if t is not None]
            return min(due) if due else None

        return await self.db.run(run)

    async def counts(self, now: float) -> list[SegmentCounts]:
        def run(conn: sqlite3.Connection) -> list[SegmentCounts]:
            self._sweep(conn, now)
            out: dict[int, SegmentCounts] = {}
            for segment, state, n in conn.execute(
                f'SELECT segment, state, count(*) FROM "{self._t}" GROUP BY segment, state'
            ):
                c = out.setdefault(segment, SegmentCounts(segment))
                c.admitted += n
                name = _STATE_NAMES[state]
                setattr(c, name, getattr(c, name) + n)
            for segment, n in conn.execute(
                f'SELECT segment, duplicates FROM "{self._t}:segments"'
            ):
                out.setdefault(segment, SegmentCounts(segment)).duplicates += n
            for segment, n in self._duplicates.items():
                out.setdefault(segment, SegmentCounts(segment)).duplicates += n
            return [out[s] for s in sorted(out)]

        return await self.db.transaction(run)

    async def prune(self, before_segment: int) -> list[int]:
        def run(conn: sqlite3.Connection) -> list[int]:
            owed = {
                s
                for (s,) in conn.execute(
                    f'SELECT DISTINCT segment FROM "{self._t}" '
                    f"WHERE state IN ({PENDING}, {WAITING}, {LEASED}) AND segment < ?",
                    (before_segment,),
                )
            }
            old = {
                s
                for (s,) in conn.execute(
                    f'SELECT DISTINCT segment FROM "{self._t}" WHERE segment < ? '
                    f'UNION SELECT segment FROM "{self._t}:segments" WHERE segment < ?',
                    (before_segment, before_segment),
                )
            }
            gone = sorted(old - owed)
            for s in gone:
                conn.execute(f'DELETE FROM "{self._t}" WHERE segment = ?', (s,))
                conn.execute(f'DELETE FROM "{self._t}:segments" WHERE segment = ?', (s,))
                self._blooms.pop(s, None)
                self._duplicates.pop(s, None)
            return gone

        return await self.db.transaction(run)

    async def wait_signal(self, timeout: float) -> None:
        # One process owns an embedded store; its own wake-ups come from the frontier.
        await asyncio.sleep(timeout)

    async def purge(self) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute(f'DELETE FROM "{self._t}"')
            conn.execute(f'DELETE FROM "{self._t}:segments"')
            self._blooms.clear()
            self._duplicates.clear()

        await self.db.transaction(run)
        save_snapshot(self.snapshot_dir, {}, 0)

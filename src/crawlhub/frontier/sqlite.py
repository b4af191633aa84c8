"""The embedded seed store: one SQLite table per frontier plus in-process bloom filters.

The table is the write-ahead log of the filters: an admission commits its (segment,
key) row before ``admit`` returns, and a filter snapshot records the last row it
covers, so a restart loads the snapshot and replays the rows after it; a kill -9
between snapshots loses no admission. The table is also the final arbiter: inside the
write transaction (one writer at a time, across processes) every key the filter calls
new is looked up, so a key another process admitted is never admitted twice. Filter
hits are settled on the event loop (a batch of duplicates needs no thread hop); lookups,
inserts and every change to the filters run on the database's own thread.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crawlhub.backends.backend import Backend
from crawlhub.backends.sqlite import SqliteDB
from crawlhub.core.errors import FrontierError
from crawlhub.frontier.bloom import ScalableBloom, load_snapshot, save_snapshot, stable_hash
from crawlhub.frontier.seed import Outcome, Seed
from crawlhub.frontier.store import Entry, SegmentCounts, check_entries, task_uuid_of
from crawlhub.frontier.validators import Validators

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
_SIGN64 = 1 << 63

# Rows are found by a 64-bit hash of their key (confirmed by the key text) through a
# two-tier index. Keys land at random places in a hash index, and a transaction writes
# every page it dirtied to the WAL: one random insert per row into an index of a
# million keys costs a 4 KB page per row. So admissions insert into "recent", a small
# index whose pages stay few and cached, and every RECENT_MAX rows its sorted contents
# move to "keys" in one pass, each page of which is then written once for many rows.
#: The claim order of a LIFO store (newest first of a priority), created only for one.
_LIFO_INDEX = """
CREATE INDEX IF NOT EXISTS "{t}:ready_lifo" ON "{t}" (priority DESC, seq DESC) WHERE state = 0;
"""
_SCHEMA = """
PRAGMA cache_size = -65536;
PRAGMA wal_autocheckpoint = 10000;
CREATE TABLE IF NOT EXISTS "{t}" (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    segment INTEGER NOT NULL,
    key_hash INTEGER NOT NULL,
    key TEXT NOT NULL,
    state INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    ready_at REAL NOT NULL,
    lease_until REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    seed TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS "{t}:ready" ON "{t}" (priority DESC, seq) WHERE state = 0;
CREATE INDEX IF NOT EXISTS "{t}:waiting" ON "{t}" (ready_at) WHERE state = 5;
CREATE INDEX IF NOT EXISTS "{t}:leased" ON "{t}" (lease_until) WHERE state = 1;
CREATE INDEX IF NOT EXISTS "{t}:state" ON "{t}" (segment, state);
CREATE TABLE IF NOT EXISTS "{t}:recent" (
    segment INTEGER, key_hash INTEGER, seq INTEGER, PRIMARY KEY (segment, key_hash, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS "{t}:keys" (
    segment INTEGER, key_hash INTEGER, seq INTEGER, PRIMARY KEY (segment, key_hash, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS "{t}:segments" (
    segment INTEGER PRIMARY KEY,
    duplicates INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS "{t}:validators" (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
"""
#: Rows in "recent" that trigger its move to "keys".
RECENT_MAX = 65536
#: Rows (or hashes) per multi-row statement, padded up to one of these sizes so each
#: statement is prepared once. A statement per row (executemany) costs ~5x more.
_SHAPES = (32, 1024)


def _shape(n: int) -> int:
    return _SHAPES[0] if n <= _SHAPES[0] else _SHAPES[-1]


@dataclass(slots=True)
class _Batch:
    """One admission on its way: results so far, duplicates per segment, and the keys
    the table must settle ((segment, key) -> index in the entries)."""

    results: list[bool]
    duplicates: dict[int, int]
    lookup: dict[tuple[int, str], int]

    def settle(self, stored: set[tuple[int, str]]) -> None:
        """``stored``: the looked-up keys the table already held; the rest were admitted."""
        for ident, i in self.lookup.items():
            if ident in stored:  # another process admitted it, or exact caught a filter FP
                self.duplicates[ident[0]] += 1
            else:
                self.results[i] = True


def row_hash(h: int) -> int:
    """The 64-bit hash (signed, as SQLite stores it) that finds the rows of the key whose
    stable 128-bit hash is ``h``."""
    return (h >> 64) - _SIGN64


def key_hash(key: str) -> int:
    return row_hash(stable_hash(key))


def check_frontier_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FrontierError(
            f"frontier name {name!r} is invalid: use 1-100 letters, digits, '_', '.' or '-'"
        )
    return name


class SqliteSeedStore:
    """Seeds of frontier ``name`` in the SQLite file ``url``; filters snapshot beside it
    in ``<file>-bloom/<name>/``."""

    def __init__(self, url: str | Backend, name: str, *, expected_items: int, fp_rate: float,
                 lifo: bool = False) -> None:
        self.name = check_frontier_name(name)
        self.url = str(url)
        #: True: of one priority the newest seed is claimed first (its own index)
        self.lifo = lifo
        self.expected_items = expected_items
        self.fp_rate = fp_rate
        self._t = f"frontier:{name}"
        t = self._t
        # (segment, key_hash, key) names a row: found through either tier of the index
        self._row = (
            f'seq IN (SELECT seq FROM "{t}:recent" WHERE segment = :segment '
            f'AND key_hash = :key_hash UNION ALL SELECT seq FROM "{t}:keys" '
            "WHERE segment = :segment AND key_hash = :key_hash) AND key = :key"
        )
        self._lookup_sql: dict[int, str] = {}
        self._insert_sql: dict[int, str] = {}
        for m in _SHAPES:
            hashes = ", ".join(f"?{i}" for i in range(2, m + 2))
            self._lookup_sql[m] = (
                f'SELECT key FROM "{t}" WHERE seq IN ('
                f'SELECT seq FROM "{t}:recent" WHERE segment = ?1 AND key_hash IN ({hashes}) '
                f'UNION ALL SELECT seq FROM "{t}:keys" WHERE segment = ?1 '
                f"AND key_hash IN ({hashes}))"
            )
            self._insert_sql[m] = (
                f'INSERT INTO "{t}" (segment, key_hash, key, state, priority, ready_at, seed) '
                "SELECT * FROM (VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * m) + ") LIMIT ?"
            )
        schema = _SCHEMA.format(t=self._t)
        if lifo:
            schema += _LIFO_INDEX.format(t=self._t)
        self.db = SqliteDB(url, schema=schema)
        self.snapshot_dir = Path(f"{self.db.path}-bloom") / name
        # Written only on the database thread; the filters are also read on the loop.
        self._blooms: dict[int, ScalableBloom] = {}
        # Counted on both (under the lock), written to the table by snapshots.
        self._duplicates: dict[int, int] = defaultdict(int)
        self._duplicates_lock = threading.Lock()
        self._max_seq = 0
        self._recent = 0  # rows this process put into "recent" since it was last moved
        self._closed = False

    def __repr__(self) -> str:
        return f"<SqliteSeedStore {self.name!r} at {self.db.path}>"

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        await self.db.run(self._restore)

    def _restore(self, conn: sqlite3.Connection) -> None:
        self._upgrade(conn)
        (self._recent,) = conn.execute(f'SELECT count(*) FROM "{self._t}:recent"').fetchone()
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

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        """A table from before the hash index (a unique index on the key text) gets its
        ``key_hash`` column, its "keys" index and loses the text index."""
        t = self._t

        def current() -> bool:
            return any(row[1] == "key_hash" for row in conn.execute(f'PRAGMA table_info("{t}")'))

        if current():
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not current():  # (another process may have upgraded it meanwhile)
                conn.create_function("crawlhub_key_hash", 1, key_hash, deterministic=True)
                conn.execute(f'ALTER TABLE "{t}" ADD COLUMN key_hash INTEGER NOT NULL DEFAULT 0')
                conn.execute(f'UPDATE "{t}" SET key_hash = crawlhub_key_hash(key)')
                conn.execute(
                    f'INSERT INTO "{t}:keys" (segment, key_hash, seq) '
                    f'SELECT segment, key_hash, seq FROM "{t}" ORDER BY segment, key_hash, seq'
                )
                conn.execute(f'DROP INDEX IF EXISTS "{t}:key"')
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def set_cache_kib(self, kib: int) -> None:
        """Size this store's SQLite page cache (the schema's 64 MB suits a long-lived hub
        with many segments; a one-off crawl keeps its RSS flat with less)."""
        await self.db.set_cache_kib(kib)

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
        with self._duplicates_lock:
            rows = list(self._duplicates.items())
            self._duplicates.clear()
        if not rows:
            return
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
        # Filter hits are settled here on the event loop: a batch of duplicates costs no
        # thread hop. Only what the filter calls new (everything when exact) goes on.
        batch = self._classify(entries, exact, None)
        if batch is None:  # a segment's filter must be loaded or built first
            return await self.db.run(lambda conn: self._admit(conn, entries, now, exact))
        if batch.lookup:
            stored = await self.db.run(lambda conn: self._write(conn, entries, batch, now))
            batch.settle(stored)
        self._count_duplicates(batch.duplicates)
        return batch.results

    async def duplicates(self, entries: Sequence[Entry], *, exact: bool) -> list[bool]:
        check_entries(entries)
        out = [False] * len(entries)
        hits: list[int] = []
        for i, e in enumerate(entries):
            bloom = self._blooms.get(e.segment)
            if bloom is None:
                return out  # the filter is not loaded: admit() loads it and decides
            if e.hash in bloom:  # a filter miss is certain: that key is new
                hits.append(i)
        if not hits:
            return out
        if exact:
            stored = await self.db.run(lambda conn: self._stored(conn, [entries[i] for i in hits]))
            hits = [i for i in hits if (entries[i].segment, entries[i].key) in stored]
        counts: dict[int, int] = defaultdict(int)
        for i in hits:
            out[i] = True
            counts[entries[i].segment] += 1
        self._count_duplicates(counts)
        return out

    def _admit(
        self, conn: sqlite3.Connection, entries: Sequence[Entry], now: float, exact: bool
    ) -> list[bool]:
        batch = self._classify(entries, exact, conn)
        assert batch is not None  # with a connection every filter can be built
        if batch.lookup:
            batch.settle(self._write(conn, entries, batch, now))
        self._count_duplicates(batch.duplicates)
        return batch.results

    def _classify(
        self, entries: Sequence[Entry], exact: bool, conn: sqlite3.Connection | None
    ) -> _Batch | None:
        """Sort ``entries`` into filter hits (duplicates, unless exact) and keys to look
        up; None when a filter is missing and there is no ``conn`` to build it."""
        batch = _Batch([False] * len(entries), defaultdict(int), {})
        lookup, duplicates, blooms = batch.lookup, batch.duplicates, self._blooms
        for i, e in enumerate(entries):
            ident = (e.segment, e.key)
            if ident in lookup:
                duplicates[e.segment] += 1
                continue
            bloom = blooms.get(e.segment)
            if bloom is None:
                if conn is None:
                    return None
                bloom = self._bloom(conn, e.segment)
            if not exact and e.hash in bloom:
                duplicates[e.segment] += 1
            else:
                lookup[ident] = i
        return batch

    def _write(
        self, conn: sqlite3.Connection, entries: Sequence[Entry], batch: _Batch, now: float
    ) -> set[tuple[int, str]]:
        """Look up ``batch.lookup`` and insert what the table lacks, in one write
        transaction (one writer at a time, across processes: nobody else can insert
        those keys in between). Returns the (segment, key) found stored."""
        lookup = batch.lookup
        conn.execute("BEGIN IMMEDIATE")
        try:
            stored = self._stored(conn, [entries[i] for i in lookup.values()])
            self._insert(
                conn, [entries[i] for ident, i in lookup.items() if ident not in stored], now
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        # Only committed keys enter the filters: a rolled-back key stays admissible.
        blooms = self._blooms
        for (segment, _), i in lookup.items():
            blooms[segment].add(entries[i].hash)
        return stored

    def _count_duplicates(self, duplicates: dict[int, int]) -> None:
        with self._duplicates_lock:
            for segment, n in duplicates.items():
                self._duplicates[segment] += n

    def _stored(self, conn: sqlite3.Connection, entries: list[Entry]) -> set[tuple[int, str]]:
        """The (segment, key) of ``entries`` the table holds: rows found by the key hash,
        confirmed by the key text."""
        by_segment: dict[int, list[int]] = defaultdict(list)
        for e in entries:
            by_segment[e.segment].append(row_hash(e.hash))
        found: set[tuple[int, str]] = set()
        for segment, hashes in by_segment.items():
            for start in range(0, len(hashes), _SHAPES[-1]):
                chunk = hashes[start : start + _SHAPES[-1]]
                m = _shape(len(chunk))
                # padded with a repeated hash, which finds nothing new
                args = [segment, *chunk] + [chunk[0]] * (m - len(chunk))
                for (key,) in conn.execute(self._lookup_sql[m], args):
                    found.add((segment, key))
        return found

    def _insert(self, conn: sqlite3.Connection, entries: list[Entry], now: float) -> None:
        """Rows for ``entries`` in their order, and their keys in "recent"."""
        if not entries:
            return
        first = 0
        for start in range(0, len(entries), _SHAPES[-1]):
            chunk = entries[start : start + _SHAPES[-1]]
            m = _shape(len(chunk))
            values: list[object] = []
            for e in chunk:
                if e.dispatched:
                    state = DISPATCHED
                else:
                    state = PENDING if e.ready_at <= now else WAITING
                values += (
                    e.segment,
                    row_hash(e.hash),
                    e.key,
                    state,
                    e.seed.priority,
                    e.ready_at,
                    e.seed.encode(),
                )
            values += [None] * (7 * (m - len(chunk)))
            values.append(len(chunk))
            last = conn.execute(self._insert_sql[m], values).lastrowid or 0
            first = first or last - len(chunk) + 1  # one writer: seqs are consecutive
            self._max_seq = max(self._max_seq, last)
        t = self._t
        conn.execute(
            f'INSERT INTO "{t}:recent" (segment, key_hash, seq) '
            f'SELECT segment, key_hash, seq FROM "{t}" WHERE seq >= ?',
            (first,),
        )
        self._recent += len(entries)
        if self._recent >= RECENT_MAX:
            self._move_recent(conn)

    def _move_recent(self, conn: sqlite3.Connection) -> None:
        """Merge "recent" into "keys" (read in key order: each page of "keys" is
        written once) and empty it."""
        t = self._t
        conn.execute(f'INSERT INTO "{t}:keys" SELECT segment, key_hash, seq FROM "{t}:recent"')
        conn.execute(f'DELETE FROM "{t}:recent"')
        self._recent = 0

    async def admitted_by(self, segment: int, key: str) -> str | None:
        def run(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                f'SELECT seed FROM "{self._t}" WHERE {self._row}',
                {"segment": segment, "key_hash": key_hash(key), "key": key},
            ).fetchone()
            return None if row is None else task_uuid_of(row[0])

        return await self.db.run(run)

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
                f"ORDER BY priority DESC, seq {order} LIMIT ?) "
                "RETURNING seq, priority, segment, key, attempts, seed",
                (lease_until, n),
            ).fetchall()
            rows.sort(key=lambda r: (-r[1], sign * r[0]))
            return [
                Seed.decode(r[5], key=r[3], segment=r[2], attempts=r[4], lease_until=lease_until,
                            rank=sign * r[0])
                for r in rows
            ]

        order, sign = ("DESC", -1) if self.lifo else ("", 1)

        return await self.db.transaction(run)

    @staticmethod
    def _ident(seed: Seed) -> dict[str, object]:
        key = seed.key or ""
        return {"segment": seed.segment, "key_hash": key_hash(key), "key": key}

    async def extend(self, seeds: Sequence[Seed], lease_until: float) -> list[bool]:
        def run(conn: sqlite3.Connection) -> list[bool]:
            return [
                conn.execute(
                    f'UPDATE "{self._t}" SET lease_until = :until '
                    f"WHERE {self._row} AND state = {LEASED}",
                    {**self._ident(s), "until": lease_until},
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
                    f"WHERE {self._row} AND state = {LEASED}",
                    self._ident(s),
                ).rowcount
                for s in seeds
            )

        return await self.db.transaction(run)

    async def finish(
        self, done: Sequence[tuple[Seed, Outcome]], now: float, ready_at: float
    ) -> list[bool]:
        retry_state = PENDING if ready_at <= now else WAITING

        def run(conn: sqlite3.Connection) -> list[bool]:
            return [
                conn.execute(
                    f'UPDATE "{self._t}" SET state = :state, lease_until = NULL, ready_at = '
                    "CASE WHEN :retry THEN :ready_at ELSE ready_at END "
                    f"WHERE {self._row} AND state IN ({PENDING}, {WAITING}, {LEASED})",
                    {
                        **self._ident(seed),
                        "state": retry_state if outcome == "retry" else _FINAL[outcome],
                        "retry": outcome == "retry",
                        "ready_at": ready_at,
                    },
                ).rowcount
                == 1
                for seed, outcome in done
            ]

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
            with self._duplicates_lock:
                unsaved = list(self._duplicates.items())
            for segment, n in unsaved:
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
                for table in ("", ":recent", ":keys", ":segments"):
                    conn.execute(f'DELETE FROM "{self._t}{table}" WHERE segment = ?', (s,))
                self._blooms.pop(s, None)
                with self._duplicates_lock:
                    self._duplicates.pop(s, None)
            return gone

        return await self.db.transaction(run)

    async def wait_signal(self, timeout: float) -> None:
        # One process owns an embedded store; its own wake-ups come from the frontier.
        await asyncio.sleep(timeout)

    async def validators(self, keys: Sequence[str]) -> dict[str, Validators]:
        def run(conn: sqlite3.Connection) -> dict[str, Validators]:
            out: dict[str, Validators] = {}
            unique = list(dict.fromkeys(keys))
            for start in range(0, len(unique), 500):
                chunk = unique[start:start + 500]
                marks = ",".join("?" * len(chunk))
                for key, value in conn.execute(
                        f'SELECT key, value FROM "{self._t}:validators" WHERE key IN ({marks})',
                        chunk):
                    out[key] = Validators.decode(value)
            return out

        return await self.db.run(run)

    async def remember(self, items: Sequence[tuple[str, Validators]]) -> None:
        if not items:
            return
        await self.db.transaction(lambda conn: conn.executemany(
            f'INSERT OR REPLACE INTO "{self._t}:validators" (key, value) VALUES (?, ?)',
            [(k, v.encode()) for k, v in items]))

    async def stored(self, segment: int, keys: Sequence[str]) -> set[str]:
        if not keys:
            return set()
        entries = [Entry(Seed(k), segment, k, stable_hash(k), 0.0) for k in set(keys) if k]
        found = await self.db.run(lambda conn: self._stored(conn, entries))
        return {key for _, key in found}

    async def archived(self, segment: int, cursor: str, count: int) -> tuple[str, list[Seed]]:
        def run(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            return conn.execute(
                f'SELECT seq, seed FROM "{self._t}" WHERE segment = ? AND seq > ?'
                ' ORDER BY seq LIMIT ?', (segment, int(cursor or 0), count)).fetchall()

        rows = await self.db.run(run)
        seeds = [Seed.decode(text) for _, text in rows]
        return (str(rows[-1][0]) if len(rows) == count else ""), seeds

    async def purge(self) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute(f'DELETE FROM "{self._t}:validators"')
            for table in ("", ":recent", ":keys", ":segments"):
                conn.execute(f'DELETE FROM "{self._t}{table}"')
            self._recent = 0
            self._blooms.clear()
            with self._duplicates_lock:
                self._duplicates.clear()

        await self.db.transaction(run)
        save_snapshot(self.snapshot_dir, {}, 0)

"""The web page's time series: per-minute rollups of sampled figures in the control
store (``control.url``: SQLite embedded, PostgreSQL distributed), kept for
:data:`RETENTION` seconds and pruned as new minutes are written.

One row per (scope, subject, metric, minute): the sum and number of the samples taken
in that minute and the newest one. A gauge (a queue's depth, an agent's memory) reads
as the minute's mean; a counter (a run's pages, a segment's admitted seeds) as its
newest value, and :func:`increases` turns those into "per minute". Several servers
sampling one store add samples to the same rows: means stay means, newest stays newest.

    store = SeriesStore(db)
    await store.open()
    await store.record([Sample("outbound", "default", "depth", 12)])
    points = await store.read("outbound", since=now - 3600)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from crawlhub.backends.sql import SqlDB

log = logging.getLogger("crawlhub.control.series")

#: Seconds of one rollup.
MINUTE = 60
#: Seconds a minute's row is kept: two days (one row per subject and metric a minute;
#: 100 subjects of 2 metrics make 576,000 rows at most).
RETENTION = 2 * 86400
#: Seconds between two prunes of the rows past :data:`RETENTION` (done by ``record``).
PRUNE_EVERY = 600
#: The longest subject or metric kept (a longer name is cut: names come from users).
MAX_NAME = 200
#: The most rows one read returns (the oldest beyond it are left out).
MAX_ROWS = 200_000

SCOPES = ("run", "outbound", "agent", "frontier")


@dataclass(frozen=True, slots=True)
class Sample:
    """One figure now: ``scope`` (``run``, ``outbound``, ``agent``, ``frontier``), the
    ``subject`` it is of (a run's id, an outbound's name...), the ``metric`` and its value.
    ``counter``: the value only grows (a total); a sampler writes it only when it
    changed, as :func:`increases` reads a gap as "no change"."""

    scope: str
    subject: str
    metric: str
    value: float
    counter: bool = False


@dataclass(frozen=True, slots=True)
class Point:
    """One minute of one series: ``ts`` its start (epoch seconds), the ``mean`` and the
    ``latest`` of its samples, and how many there were."""

    ts: int
    mean: float
    latest: float
    samples: int


Series = dict[tuple[str, str], list[Point]]


def minute_of(ts: float) -> int:
    """The start of the minute ``ts`` falls in."""
    return int(ts // MINUTE) * MINUTE


class SeriesStore:
    """The rollups in table ``{prefix}series`` of the control store; see the module."""

    def __init__(self, db: SqlDB, *, retention: float = RETENTION,
                 clock: Callable[[], float] = time.time) -> None:
        if retention < MINUTE:
            raise ValueError(f"a series retention of {retention!r} s is under a minute;"
                             f" give at least {MINUTE}")
        self.db = db
        self.retention = retention
        self.clock = clock
        self.table = db.table("series")
        self._pruned = 0.0

    async def open(self) -> None:
        t = self.table
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {t} (scope TEXT NOT NULL, subject TEXT NOT NULL,"
            " metric TEXT NOT NULL, ts BIGINT NOT NULL, total DOUBLE PRECISION NOT NULL,"
            " samples BIGINT NOT NULL, latest DOUBLE PRECISION NOT NULL,"
            " PRIMARY KEY (scope, subject, metric, ts))",
            f"CREATE INDEX IF NOT EXISTS {t}_ts ON {t} (ts)",
        ])

    async def record(self, samples: Iterable[Sample], at: float | None = None) -> int:
        """Add ``samples`` taken at ``at`` (now) to their minute's rows: one statement
        for all of them; then prune when :data:`PRUNE_EVERY` has passed. Returns how many
        were written."""
        now = self.clock() if at is None else at
        ts = minute_of(now)
        rows = [(s.scope[:MAX_NAME], s.subject[:MAX_NAME], s.metric[:MAX_NAME], ts,
                 float(s.value)) for s in samples if _finite(s.value)]
        # the same series twice in one call would be one row updated twice: keep the last
        unique = list({row[:3]: row for row in rows}.values())
        await self.db.executemany(
            f"INSERT INTO {self.table} AS s (scope, subject, metric, ts, total, samples,"
            " latest) VALUES ($1, $2, $3, $4, $5, 1, $5)"
            " ON CONFLICT (scope, subject, metric, ts) DO UPDATE SET"
            " total = s.total + excluded.total, samples = s.samples + 1,"
            " latest = excluded.latest", unique)
        if now - self._pruned >= PRUNE_EVERY:
            await self.prune(now)
        return len(unique)

    async def prune(self, now: float | None = None) -> int:
        """Delete the minutes older than the retention; how many rows went."""
        now = self.clock() if now is None else now
        self._pruned = now
        gone = await self.db.execute(f"DELETE FROM {self.table} WHERE ts < $1",
                                     minute_of(now - self.retention))
        if gone:
            log.debug("series: pruned %d minute rows older than %g s", gone, self.retention)
        return gone

    async def read(self, scope: str, *, since: float, until: float | None = None,
                   subjects: Sequence[str] | None = None,
                   metrics: Sequence[str] | None = None) -> Series:
        """The minutes of ``scope`` from ``since`` to ``until`` (now), oldest first, per
        (subject, metric); only ``subjects`` and ``metrics`` when given (an empty list
        reads nothing). One indexed read."""
        if (subjects is not None and not subjects) or (metrics is not None and not metrics):
            return {}
        args: list[Any] = [scope, minute_of(since),
                           minute_of(self.clock() if until is None else until)]
        where = ["scope = $1", "ts >= $2", "ts <= $3"]
        for column, values in (("subject", subjects), ("metric", metrics)):
            if values is not None:
                marks = []
                for value in values:
                    args.append(value[:MAX_NAME])
                    marks.append(f"${len(args)}")
                where.append(f"{column} IN ({', '.join(marks)})")
        args.append(MAX_ROWS)
        rows = await self.db.fetch(
            f"SELECT subject, metric, ts, total, samples, latest FROM {self.table}"
            f" WHERE {' AND '.join(where)} ORDER BY ts DESC LIMIT ${len(args)}", *args)
        found: Series = {}
        for subject, metric, ts, total, count, latest in reversed(rows):
            found.setdefault((subject, metric), []).append(
                Point(int(ts), float(total) / max(int(count), 1), float(latest), int(count)))
        return found

    async def count(self) -> int:
        """The rows held (every scope): what the retention bounds."""
        row = await self.db.fetchone(f"SELECT COUNT(*) FROM {self.table}")
        return int(row[0]) if row else 0


def increases(points: Sequence[Point], *, start: float | None = None
              ) -> list[tuple[int, float]]:
    """Per minute, how much a counter grew since the minute before that has a point
    (``latest`` - the previous ``latest``; a drop, a counter started again, counts as
    its new value). The first point has no minute before: with ``start`` (the counter
    was 0 then, e.g. a run's start) its whole value, else it is left out; so is it when
    it came over two minutes after ``start`` (the minutes before were pruned)."""
    out: list[tuple[int, float]] = []
    previous: float | None = None
    if start is not None and points and points[0].ts <= minute_of(start) + 2 * MINUTE:
        previous = 0.0
    for point in points:
        if previous is not None:
            grew = point.latest - previous
            out.append((point.ts, point.latest if grew < 0 else grew))
        previous = point.latest
    return out


def _finite(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))

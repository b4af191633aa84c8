"""What both SQL log stores share: the filters of a search, keyset paging, rows back to
lines, and retention in batches. Each backend adds only its text index (FTS5 or a
tsvector) and its batch write."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from crawlhub.control.db import ControlDB, Tx
from crawlhub.control.logs.line import LEVELS, LogLine
from crawlhub.control.logs.store import LogPage
from crawlhub.control.logs.text import LogQuery

#: Columns read back, in :func:`row_line`'s order (``l`` is the lines table's alias).
COLUMNS = "l.id, l.ts, l.level, l.source, l.job, l.run, l.task, l.host, l.stream, l.message"
#: Lines deleted per transaction when pruning: writers wait at most this long.
PRUNE_BATCH = 5000


class Args:
    """``$n`` placeholders numbered as values are added."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def add(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


def row_line(row: Sequence[Any]) -> LogLine:
    rank = int(row[2])
    return LogLine(id=int(row[0]), ts=float(row[1]),
                   level=LEVELS[rank] if 0 <= rank < len(LEVELS) else "info",
                   source=row[3], job=row[4], run=row[5], task=row[6], host=row[7] or "",
                   stream=row[8], message=row[9])


def bounds(query: LogQuery, args: Args, column: str) -> list[str]:
    """The keyset conditions of ``query`` on the id ``column``."""
    where = []
    if query.before is not None:
        where.append(f"{column} < {args.add(int(query.before))}")
    if query.after is not None:
        where.append(f"{column} > {args.add(int(query.after))}")
    return where


def order_by(query: LogQuery, column: str) -> str:
    """Newest first, or oldest first for a forward read (``after``)."""
    return f"{column} {'ASC' if query.after is not None else 'DESC'}"


def where_clause(conditions: list[str]) -> str:
    return f" WHERE {' AND '.join(conditions)}" if conditions else ""


def indexes(table: str) -> list[str]:
    """The indexes both backends keep on the lines table: the uid (the collector's
    dedupe), each filter column by id (keyset paging within a job, run, task or level)
    and ``ts`` (since / until, retention by age)."""
    return [
        f"CREATE UNIQUE INDEX IF NOT EXISTS {table}_uid ON {table} (uid) WHERE uid IS NOT NULL",
        *(f"CREATE INDEX IF NOT EXISTS {table}_{c} ON {table} ({c}, id) WHERE {c} IS NOT NULL"
          for c in ("job", "run", "task")),
        f"CREATE INDEX IF NOT EXISTS {table}_level ON {table} (level, id)",
        f"CREATE INDEX IF NOT EXISTS {table}_ts ON {table} (ts)",
    ]


class SqlLogStore:
    """The shared part of :class:`~crawlhub.control.logs.sqlite.SqliteLogStore` and
    :class:`~crawlhub.control.logs.postgres.PostgresLogStore`, on a
    :class:`~crawlhub.control.db.ControlDB` (``table`` gets the db's prefix)."""

    def __init__(self, db: ControlDB, *, table: str = "log_lines") -> None:
        self.db = db
        self.table = db.table(table)
        self.name = db.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.table}>"

    async def close(self) -> None:
        await self.db.close()

    # -- reading ------------------------------------------------------------------------
    async def search(self, query: LogQuery) -> LogPage:
        args = Args()
        filters = self._filters(query, args)
        narrow = await self._narrow(query, filters, list(args.values))
        sql = self._select(query, filters, args, limit=args.add(query.limit + 1),
                           narrow=narrow)
        rows = await self.db.fetch(sql, *args.values)
        lines = [row_line(row) for row in rows[:query.limit]]
        more = len(rows) > query.limit
        return LogPage(lines, lines[-1].id if more and lines else None)

    def _filters(self, query: LogQuery, args: Args) -> list[str]:
        """Conditions on the lines table ``l`` (every index they need exists)."""
        where: list[str] = []
        for column in ("job", "run", "task", "source"):
            value = getattr(query, column)
            if value is not None:
                where.append(f"l.{column} = {args.add(value)}")
        rank = query.min_rank()
        if rank:  # 0 (debug) is every level
            where.append(f"l.level >= {args.add(rank)}")
        if query.since is not None:
            where.append(f"l.ts >= {args.add(float(query.since))}")
        if query.until is not None:
            where.append(f"l.ts < {args.add(float(query.until))}")
        return where

    async def _narrow(self, query: LogQuery, filters: list[str], values: list[Any]) -> bool:
        """Whether the filters leave so few lines that walking them beats walking the
        text index (backends whose planner cannot tell say so here)."""
        return False

    def _select(self, query: LogQuery, filters: list[str], args: Args, *,
                limit: str, narrow: bool = False) -> str:
        """The backend's SELECT of :data:`COLUMNS` for ``query.search`` and ``filters``,
        bounded by :func:`bounds`, ordered by :func:`order_by`, at most ``limit`` rows;
        ``narrow``: see :meth:`_narrow`."""
        raise NotImplementedError

    async def last_id(self) -> int:
        row = await self.db.fetchone(f"SELECT max(id) FROM {self.table}")
        return int(row[0]) if row and row[0] is not None else 0

    async def count(self) -> int:
        row = await self.db.fetchone(f"SELECT count(*) FROM {self.table}")
        return int(row[0]) if row else 0

    # -- retention ----------------------------------------------------------------------
    async def prune(self, *, max_age: float | None = None, max_lines: int | None = None,
                    now: float | None = None) -> int:
        """See :meth:`LogStore.prune`. Cost: one indexed range per batch of
        :data:`PRUNE_BATCH` lines; the line count needs one pass over the id index."""
        removed = 0
        if max_age is not None:
            cutoff = (time.time() if now is None else now) - float(max_age)
            removed += await self._delete_batches(
                f"SELECT id FROM {self.table} WHERE ts < $1 ORDER BY id LIMIT {PRUNE_BATCH}",
                cutoff)
        if max_lines is not None:
            row = await self.db.fetchone(
                f"SELECT id FROM {self.table} ORDER BY id DESC LIMIT 1 OFFSET $1",
                int(max_lines))
            if row is not None:
                removed += await self._delete_batches(
                    f"SELECT id FROM {self.table} WHERE id <= $1 ORDER BY id"
                    f" LIMIT {PRUNE_BATCH}", int(row[0]))
        if removed:
            await self._after_prune()
        return removed

    async def _delete_batches(self, select_ids: str, bound: Any) -> int:
        removed = 0
        while True:
            async def step(tx: Tx) -> int:
                ids = [int(r[0]) for r in await tx.fetch(select_ids, bound)]
                if ids:
                    await self._delete(tx, ids)
                return len(ids)

            done = await self.db.transaction(step, lock="logs")
            removed += done
            if done < PRUNE_BATCH:
                return removed

    async def _delete(self, tx: Tx, ids: list[int]) -> None:
        """Delete the lines ``ids`` (and their index entries) inside ``tx``."""
        raise NotImplementedError

    async def _after_prune(self) -> None:
        """Refresh the planner's statistics after a prune (cheap, incremental)."""

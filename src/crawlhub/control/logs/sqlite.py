"""The embedded log store: one SQLite file, the lines in a table and their words in an
FTS5 index (contentless: the words are kept once, in the index)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crawlhub.control.db import ControlDB, Tx
from crawlhub.control.logs.line import LogLine, level_rank
from crawlhub.control.logs.sql import (
    COLUMNS,
    Args,
    SqlLogStore,
    bounds,
    indexes,
    order_by,
    where_clause,
)
from crawlhub.control.logs.text import LogQuery, SearchText, Term, words

#: Rows per INSERT statement (11 values each: under SQLite's 32766 variables).
CHUNK = 1000
#: Filtered lines under which a search walks them rather than the word matches.
NARROW = 2000


def fts_term(term: Term) -> str:
    """One term as an FTS5 phrase: its words quoted (they are letters and digits only,
    so nothing in them is FTS5 syntax), ``*`` for a prefix."""
    return '"' + " ".join(term.words) + '"' + (" *" if term.prefix else "")


def fts_match(search: SearchText) -> str | None:
    """The FTS5 expression of the include terms, minus the exclude terms; None when
    there is no include term (FTS5 cannot match "not x" alone)."""
    if not search.include:
        return None
    expr = "(" + " AND ".join(fts_term(t) for t in search.include) + ")"
    if search.exclude:
        expr += " NOT (" + " OR ".join(fts_term(t) for t in search.exclude) + ")"
    return expr


def indexed(message: str) -> str:
    """The text FTS5 indexes for ``message``: its words separated by spaces (FTS5's
    ``ascii`` tokenizer splits on the spaces and leaves the words as they are)."""
    return " ".join(words(message))


class SqliteLogStore(SqlLogStore):
    """Lines in ``<prefix>log_lines``, words in ``<prefix>log_lines_fts``.

    Write cost: one transaction per batch, one INSERT per :data:`CHUNK` lines into each
    table (plus one lookup of the uids given). Search: FTS5 walks the matching ids newest
    first and stops at the page's end; filters without text walk an index of the filter
    column by id.
    """

    def __init__(self, db: ControlDB, *, table: str = "log_lines") -> None:
        if db.dialect != "sqlite":
            raise ValueError(f"SqliteLogStore needs a SQLite ControlDB, not {db.name}")
        super().__init__(db, table=table)
        self.fts = f"{self.table}_fts"

    async def open(self) -> None:
        t = self.table
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {t} (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " ts REAL NOT NULL, level INTEGER NOT NULL, source TEXT NOT NULL, job TEXT,"
            " run TEXT, task TEXT, host TEXT NOT NULL DEFAULT '', stream TEXT,"
            " message TEXT NOT NULL, uid TEXT)",
            *indexes(t),
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.fts} USING fts5(words, content='',"
            " columnsize=0, tokenize='ascii')",
        ])

    # -- writing ------------------------------------------------------------------------
    async def write(self, lines: Sequence[LogLine], uids: Sequence[str | None] | None = None
                    ) -> int:
        if not lines:
            return 0
        rows: list[tuple[Any, ...]] = [
            (line.ts, level_rank(line.level), line.source, line.job, line.run, line.task,
             line.host, line.stream, line.message, uids[i] if uids else None)
            for i, line in enumerate(lines)]
        texts = [indexed(line.message) for line in lines]  # before the lock: CPU only
        t = self.table

        async def step(tx: Tx) -> int:
            keep = await self._new_rows(tx, rows)
            if not keep:
                return 0
            # Ids given here, one after the last ever used (AUTOINCREMENT keeps that in
            # sqlite_sequence): the FTS rows need them, and the write lock is ours.
            top = await tx.fetch(
                "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = ?), 0),"
                f" coalesce((SELECT max(id) FROM {t}), 0))", t)
            first = int(top[0][0]) + 1
            for start in range(0, len(keep), CHUNK):
                part = keep[start:start + CHUNK]
                values: list[Any] = []
                fts_values: list[Any] = []
                for row_id, i in enumerate(part, start=first + start):
                    values.append(row_id)
                    values.extend(rows[i])
                    fts_values.extend((row_id, texts[i]))
                await tx.execute(
                    f"INSERT INTO {t} (id, ts, level, source, job, run, task, host, stream,"
                    " message, uid) VALUES " + ",".join(["(?,?,?,?,?,?,?,?,?,?,?)"] * len(part)),
                    *values)
                await tx.execute(f"INSERT INTO {self.fts} (rowid, words) VALUES "
                                 + ",".join(["(?,?)"] * len(part)), *fts_values)
            return len(keep)

        return await self.db.transaction(step, lock="logs")

    async def _new_rows(self, tx: Tx, rows: list[tuple[Any, ...]]) -> list[int]:
        """Indexes of ``rows`` to insert: those without a uid, and those whose uid
        (the last value) is neither stored nor earlier in the batch."""
        given = [row[-1] for row in rows if row[-1] is not None]
        if not given:
            return list(range(len(rows)))
        seen: set[str] = set()
        for start in range(0, len(given), CHUNK):
            part = given[start:start + CHUNK]
            found = await tx.fetch(f"SELECT uid FROM {self.table} WHERE uid IN"
                                   f" ({','.join('?' * len(part))})", *part)
            seen.update(str(r[0]) for r in found)
        keep = []
        for i, row in enumerate(rows):
            uid = row[-1]
            if uid is None:
                keep.append(i)
            elif uid not in seen:
                seen.add(uid)
                keep.append(i)
        return keep

    # -- reading ------------------------------------------------------------------------
    async def _narrow(self, query: LogQuery, filters: list[str], values: list[Any]) -> bool:
        """SQLite's planner cannot weigh an FTS5 match against a filter, so look: with
        a job, run or task filter, count (capped) the lines the filters leave and the
        lines the words match. Walking the filtered lines costs about 30 us a line (one
        FTS5 probe each), walking the matches about 0.5 us: walk the filtered lines when
        they are under :data:`NARROW` and the matches over 50 times as many. Cost: two
        capped counts, well under a millisecond."""
        match = fts_match(query.search)
        if match is None or not (query.job or query.run or query.task):
            return False
        args = Args()
        args.values = list(values)
        conditions = [*filters, *bounds(query, args, "l.id")]
        row = await self.db.fetchone(
            f"SELECT count(*) FROM (SELECT 1 FROM {self.table} AS l"
            f"{where_clause(conditions)} LIMIT {NARROW + 1})", *args.values)
        lines = int(row[0]) if row else 0
        if lines > NARROW:
            return False
        cap = 50 * lines + 1
        row = await self.db.fetchone(
            f"SELECT count(*) FROM (SELECT rowid FROM {self.fts} WHERE words MATCH $1"
            f" LIMIT {cap})", match)
        return row is not None and int(row[0]) >= cap

    def _select(self, query: LogQuery, filters: list[str], args: Args, *,
                limit: str, narrow: bool = False) -> str:
        search = query.search
        match = fts_match(search)
        if match is not None and not narrow:
            # FTS5 drives: it hands out matching ids in order and stops at the limit.
            conditions = [f"f.words MATCH {args.add(match)}", *bounds(query, args, "f.rowid"),
                          *filters]
            return (f"SELECT {COLUMNS} FROM {self.fts} AS f CROSS JOIN {self.table} AS l"
                    f" ON l.id = f.rowid{where_clause(conditions)}"
                    f" ORDER BY {order_by(query, 'f.rowid')} LIMIT {limit}")
        # The filtered lines drive (through their index), each checked against FTS5.
        conditions = [*bounds(query, args, "l.id"), *filters]
        if match is not None:
            conditions.append(f"EXISTS (SELECT 1 FROM {self.fts} AS f WHERE f.words"
                              f" MATCH {args.add(match)} AND f.rowid = l.id)")
        elif search.exclude:
            unwanted = " OR ".join(fts_term(t) for t in search.exclude)
            conditions.append(f"NOT EXISTS (SELECT 1 FROM {self.fts} AS f WHERE f.words"
                              f" MATCH {args.add(unwanted)} AND f.rowid = l.id)")
        if search.substring is not None:
            conditions.append(f"instr(l.message, {args.add(search.substring)}) > 0")
        return (f"SELECT {COLUMNS} FROM {self.table} AS l{where_clause(conditions)}"
                f" ORDER BY {order_by(query, 'l.id')} LIMIT {limit}")

    # -- retention ----------------------------------------------------------------------
    async def _delete(self, tx: Tx, ids: list[int]) -> None:
        """A contentless FTS5 row is deleted by giving its words again: they are made
        from the message exactly as when it was written."""
        listed = ",".join(str(int(i)) for i in ids)
        rows = await tx.fetch(f"SELECT id, message FROM {self.table} WHERE id IN ({listed})")
        for start in range(0, len(rows), CHUNK):
            part = rows[start:start + CHUNK]
            values: list[Any] = []
            for row_id, message in part:
                values.extend((row_id, indexed(message)))
            await tx.execute(f"INSERT INTO {self.fts} ({self.fts}, rowid, words) VALUES "
                             + ",".join(["('delete',?,?)"] * len(part)), *values)
        await tx.execute(f"DELETE FROM {self.table} WHERE id IN ({listed})")

    async def _after_prune(self) -> None:
        await self.db.execute("PRAGMA optimize")

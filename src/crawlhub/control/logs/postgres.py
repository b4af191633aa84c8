"""The distributed log store: PostgreSQL full text, the lines' words in a ``tsvector``
column under a GIN index.

The words are made by :func:`crawlhub.control.logs.text.words` and handed over as a
``tsvector`` literal with positions (not through ``to_tsvector``, whose parser would see
``example.com/items`` as one host-and-path token), and searches as a ``tsquery`` literal
of the same words: the same lines match here as in SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence

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

#: PostgreSQL keeps word positions up to this; later words share it.
MAX_POSITION = 16383


def _lexeme(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"


def tsvector(message: str) -> str:
    """The ``tsvector`` literal of ``message``'s words with their positions (1-based)."""
    return " ".join(f"{_lexeme(w)}:{min(i, MAX_POSITION)}"
                    for i, w in enumerate(words(message), start=1))


def ts_term(term: Term) -> str:
    """One term as a ``tsquery``: its words followed one by another (``<->``), the last
    one a prefix (``:*``) when asked."""
    parts = [_lexeme(w) for w in term.words]
    if term.prefix:
        parts[-1] += ":*"
    return "(" + " <-> ".join(parts) + ")"


def ts_query(search: SearchText) -> str | None:
    """The ``tsquery`` literal of include and exclude terms; None when there are none."""
    parts = [ts_term(t) for t in search.include]
    parts += ["!" + ts_term(t) for t in search.exclude]
    return " & ".join(parts) or None


class PostgresLogStore(SqlLogStore):
    """Lines in ``<prefix>log_lines`` with a ``words tsvector`` column and a GIN index.

    Write cost: one INSERT of the whole batch (arrays unnested: one round trip) in a
    transaction that holds an advisory lock, so ids become visible in order (a tail
    reading ``id > n`` never skips a line whose transaction committed late). Search:
    the planner picks the GIN index for rare words and a backwards walk of the ids for
    common ones (statistics: ``ANALYZE``, run by autovacuum and after a prune).
    """

    def __init__(self, db: ControlDB, *, table: str = "log_lines") -> None:
        if db.dialect != "postgresql":
            raise ValueError(f"PostgresLogStore needs a PostgreSQL ControlDB, not {db.name}")
        super().__init__(db, table=table)

    async def open(self) -> None:
        t = self.table
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {t} (id BIGINT GENERATED ALWAYS AS IDENTITY"
            " PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, level SMALLINT NOT NULL,"
            " source TEXT NOT NULL, job TEXT, run TEXT, task TEXT,"
            " host TEXT NOT NULL DEFAULT '', stream TEXT, message TEXT NOT NULL, uid TEXT,"
            " words TSVECTOR NOT NULL)",
            *indexes(t),
            f"CREATE INDEX IF NOT EXISTS {t}_words ON {t} USING GIN (words)",
        ])

    async def write(self, lines: Sequence[LogLine], uids: Sequence[str | None] | None = None
                    ) -> int:
        if not lines:
            return 0
        columns: tuple[list[object], ...] = tuple([] for _ in range(11))
        for i, line in enumerate(lines):
            for column, value in zip(columns, (
                    line.ts, level_rank(line.level), line.source, line.job, line.run,
                    line.task, line.host, line.stream, line.message,
                    uids[i] if uids else None, tsvector(line.message)), strict=True):
                column.append(value)
        sql = (f"INSERT INTO {self.table} (ts, level, source, job, run, task, host, stream,"
               " message, uid, words) SELECT u.ts, u.level, u.source, u.job, u.run, u.task,"
               " u.host, u.stream, u.message, u.uid, u.words::tsvector FROM unnest("
               "$1::float8[], $2::int2[], $3::text[], $4::text[], $5::text[], $6::text[],"
               " $7::text[], $8::text[], $9::text[], $10::text[], $11::text[])"
               " WITH ORDINALITY AS u(ts, level, source, job, run, task, host, stream,"
               " message, uid, words, n) ORDER BY u.n"
               " ON CONFLICT (uid) WHERE uid IS NOT NULL DO NOTHING")

        async def step(tx: Tx) -> int:
            return await tx.execute(sql, *columns)

        return await self.db.transaction(step, lock="logs")

    def _select(self, query: LogQuery, filters: list[str], args: Args, *,
                limit: str, narrow: bool = False) -> str:
        search = query.search
        conditions = [*bounds(query, args, "l.id"), *filters]
        text = ts_query(search)
        if text is not None:
            conditions.append(f"l.words @@ {args.add(text)}::tsquery")
        if search.substring is not None:
            conditions.append(f"strpos(l.message, {args.add(search.substring)}) > 0")
        return (f"SELECT {COLUMNS} FROM {self.table} AS l{where_clause(conditions)}"
                f" ORDER BY {order_by(query, 'l.id')} LIMIT {limit}")

    async def _delete(self, tx: Tx, ids: list[int]) -> None:
        await tx.execute(f"DELETE FROM {self.table} WHERE id = ANY($1::bigint[])", ids)

    async def _after_prune(self) -> None:
        await self.db.execute(f"ANALYZE {self.table}")

"""SQLite backend of the collect metadata store (embedded default), on the one SQLite runner.

WAL mode and a busy timeout let a CLI run and a server share one file.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crawlhub.collect.store.base import SqlMetadataStore
from crawlhub.storage.sqlite import SqliteDB, immediate

_PLACEHOLDER = re.compile(r"\$(\d+)")


class SqliteMetadataStore(SqlMetadataStore):
    """Progress, cursors and runs in one SQLite file (``:memory:`` works too)."""

    def __init__(self, path: str | Path, *, table_prefix: str = "crawlhub_collect_") -> None:
        super().__init__(table_prefix=table_prefix)
        self.path = str(path)
        self._db: SqliteDB | None = None

    async def _connect(self) -> None:
        self._db = SqliteDB(self.path, name=f"metadata store {self.path}")
        await self._db.run(lambda conn: None)  # open the file now: a bad path fails here

    async def _disconnect(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    def _conn(self) -> SqliteDB:
        if self._db is None:
            raise RuntimeError("SqliteMetadataStore used before open()")
        return self._db

    async def _execute(self, sql: str, *args: Any) -> None:
        query = _PLACEHOLDER.sub(r"?\1", sql)
        await self._conn().run(lambda conn: conn.execute(query, args).close())

    async def _fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        query = _PLACEHOLDER.sub(r"?\1", sql)
        return await self._conn().run(
            lambda conn: [tuple(r) for r in conn.execute(query, args).fetchall()])

    async def _fetch_write(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        query = _PLACEHOLDER.sub(r"?\1", sql)

        def write(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            with immediate(conn):
                return [tuple(r) for r in conn.execute(query, args).fetchall()]

        return await self._conn().run(write)

    async def _executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        query = _PLACEHOLDER.sub(r"?\1", sql)

        def write(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                conn.executemany(query, rows)

        await self._conn().run(write)

"""SQLite backend of the collect metadata store (embedded default), via aiosqlite.

WAL mode and a busy timeout let a CLI run and a server share one file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from crawlhub.collect.store.base import SqlMetadataStore

_PLACEHOLDER = re.compile(r"\$(\d+)")


class SqliteMetadataStore(SqlMetadataStore):
    """Progress, cursors and runs in one SQLite file (``:memory:`` works too)."""

    def __init__(self, path: str | Path, *, table_prefix: str = "crawlhub_collect_") -> None:
        super().__init__(table_prefix=table_prefix)
        self.path = str(path)
        self._db: aiosqlite.Connection | None = None

    async def _connect(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path, timeout=30)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute("PRAGMA synchronous=NORMAL")
        await self._db.execute("PRAGMA busy_timeout=30000")

    async def _disconnect(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("SqliteMetadataStore used before open()")
        return self._db

    async def _execute(self, sql: str, *args: Any) -> None:
        db = self._conn()
        await db.execute(_PLACEHOLDER.sub(r"?\1", sql), args)
        await db.commit()

    async def _fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        async with self._conn().execute(_PLACEHOLDER.sub(r"?\1", sql), args) as cur:
            return [tuple(r) for r in await cur.fetchall()]

    async def _fetch_write(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        db = self._conn()
        async with db.execute(_PLACEHOLDER.sub(r"?\1", sql), args) as cur:
            rows = [tuple(r) for r in await cur.fetchall()]
        await db.commit()
        return rows

    async def _executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        db = self._conn()
        await db.executemany(_PLACEHOLDER.sub(r"?\1", sql), rows)
        await db.commit()

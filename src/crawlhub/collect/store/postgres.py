"""PostgreSQL backend of the collect metadata store (distributed scale), via asyncpg.

A small pool; every statement is its own transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crawlhub.collect.store.base import SqlMetadataStore
from crawlhub.extras import require


class PostgresMetadataStore(SqlMetadataStore):
    """Progress, cursors and runs in PostgreSQL tables named ``<prefix>progress`` etc."""

    def __init__(self, url: str, *, table_prefix: str = "crawlhub_collect_") -> None:
        super().__init__(table_prefix=table_prefix)
        self.url = url
        self._pool: Any = None

    async def _connect(self) -> None:
        asyncpg = require("asyncpg", "postgres", needed_by="the PostgreSQL metadata store")
        self._pool = await asyncpg.create_pool(self.url, min_size=1, max_size=4)

    async def _disconnect(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def _require(self) -> Any:
        if self._pool is None:
            raise RuntimeError("PostgresMetadataStore used before open()")
        return self._pool

    async def _execute(self, sql: str, *args: Any) -> None:
        await self._require().execute(sql, *args)

    async def _fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        rows = await self._require().fetch(sql, *args)
        return [tuple(r) for r in rows]

    async def _fetch_write(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return await self._fetch(sql, *args)

    async def _executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        await self._require().executemany(sql, rows)

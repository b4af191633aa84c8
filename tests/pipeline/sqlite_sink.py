"""A small real SQLite sink for pipeline tests: one transaction per batch, upsert by id.

``name`` is NOT NULL, so a record without a name makes its whole batch roll back; a
``gate`` (asyncio.Event) holds writes back so tests can build a write backlog.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from crawlhub.errors import SinkError
from crawlhub.sinks.base import BatchResult


class SqliteSink:
    def __init__(self, path: Path, *, table: str = "records", gate: asyncio.Event | None = None):
        self.name = f"sqlite:{table}"
        self.path = path
        self.table = table
        self.gate = gate
        self.batches: list[int] = []  # sizes of batches handed to write_batch, in order
        self.opened = 0
        self.closed = 0
        self.batch_written = asyncio.Event()
        self._db: aiosqlite.Connection | None = None

    async def open(self) -> None:
        self.opened += 1
        self._db = await aiosqlite.connect(self.path, isolation_level=None)
        await self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} "
            "(id TEXT PRIMARY KEY, name TEXT NOT NULL, body TEXT NOT NULL)"
        )

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        assert self._db is not None, "write_batch before open"
        self.batches.append(len(records))
        if self.gate is not None:
            await self.gate.wait()
        await self._db.execute("BEGIN")
        try:
            for record in records:
                await self._db.execute(
                    f"INSERT INTO {self.table} (id, name, body) VALUES (?, ?, ?) "
                    "ON CONFLICT(id) DO UPDATE SET name = excluded.name, body = excluded.body",
                    (str(record.get("id")), record.get("name"), json.dumps(record)),
                )
        except Exception as exc:
            await self._db.execute("ROLLBACK")
            raise SinkError(f"{self.name}: batch of {len(records)} rolled back: {exc}") from exc
        await self._db.execute("COMMIT")
        self.batch_written.set()
        return BatchResult(inserted=len(records))

    async def close(self) -> None:
        self.closed += 1
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def ids(self) -> list[str]:
        async with aiosqlite.connect(self.path) as db:
            try:
                rows = await (await db.execute(f"SELECT id FROM {self.table}")).fetchall()
            except aiosqlite.OperationalError:  # never opened: no table
                return []
        return sorted((str(r[0]) for r in rows), key=lambda v: (len(v), v))

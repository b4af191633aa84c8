"""A small real SQLite sink for pipeline tests: one transaction per batch, upsert by id.

``name`` is NOT NULL, so a record without a name makes its whole batch roll back; a
``gate`` (asyncio.Event) holds writes back so tests can build a write backlog.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crawlhub.backends.sqlite import SqliteDB, immediate
from crawlhub.core.errors import SinkError
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
        self._db: SqliteDB | None = None

    async def open(self) -> None:
        self.opened += 1
        self._db = SqliteDB(self.path, schema=f"CREATE TABLE IF NOT EXISTS {self.table} "
                            "(id TEXT PRIMARY KEY, name TEXT NOT NULL, body TEXT NOT NULL)")
        await self._db.run(lambda conn: None)

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        assert self._db is not None, "write_batch before open"
        self.batches.append(len(records))
        if self.gate is not None:
            await self.gate.wait()
        rows = [(str(r.get("id")), r.get("name"), json.dumps(r)) for r in records]

        def write(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                conn.executemany(
                    f"INSERT INTO {self.table} (id, name, body) VALUES (?, ?, ?) "
                    "ON CONFLICT(id) DO UPDATE SET name = excluded.name, body = excluded.body",
                    rows,
                )

        try:
            await self._db.run(write)
        except sqlite3.Error as exc:
            raise SinkError(f"{self.name}: batch of {len(records)} rolled back: {exc}") from exc
        self.batch_written.set()
        return BatchResult(inserted=len(records))

    async def close(self) -> None:
        self.closed += 1
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    async def ids(self) -> list[str]:
        db = SqliteDB(self.path)
        try:
            rows = await db.run(lambda c: c.execute(f"SELECT id FROM {self.table}").fetchall())
        except sqlite3.OperationalError:  # never opened: no table
            return []
        finally:
            await db.close()
        return sorted((str(r[0]) for r in rows), key=lambda v: (len(v), v))

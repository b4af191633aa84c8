"""SQLite sink: one row per record key in a table of a local database file, upserted.

Processes may share the file (WAL, ``BEGIN IMMEDIATE``): spiders or writers on one machine
write one table; a redelivered record with unchanged data writes nothing.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from crawlhub.backends.sqlite import SqliteDB
from crawlhub.core.errors import SinkError
from crawlhub.sinks.base import BatchResult, SinkConfig
from crawlhub.sinks.records import PreparedBatch, prepare_batch

#: A table name (quoted in SQL; anchored: pydantic's pattern searches).
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_LOOKUP_CHUNK = 500


class SqliteSinkConfig(SinkConfig):
    """Upsert records into a table of a SQLite file: ``key`` (the record key text),
    ``data`` (the record as JSON, metadata included), ``hash`` and ``written_at``."""

    type: Literal["sqlite"] = "sqlite"
    path: Path
    table: str = Field(default="items", pattern=_TABLE.pattern)
    #: FULL: a committed batch survives a power cut too (NORMAL: a process crash).
    synchronous: Literal["NORMAL", "FULL"] = "FULL"


class SqliteSink:
    """One transaction per batch: look up the keys' hashes, insert new keys, update
    changed ones, skip unchanged ones. Read the table with any SQLite client::

        SELECT key, json_extract(data, '$.title') FROM items;
    """

    def __init__(self, config: SqliteSinkConfig, *, name: str = "sqlite") -> None:
        self.name = name
        self.config = config
        self.path = Path(config.path)
        self.table = config.table
        self._db: SqliteDB | None = None

    async def open(self) -> None:
        schema = (f'CREATE TABLE IF NOT EXISTS "{self.table}" (key TEXT PRIMARY KEY,'
                  " data TEXT NOT NULL, hash TEXT NOT NULL, written_at REAL NOT NULL)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = SqliteDB(self.path, schema=schema, synchronous=self.config.synchronous,
                            name=f"sink '{self.name}' {self.path}")
        await self._db.run(lambda db: db.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        batch = prepare_batch(records, self.config.key, sink=self.name,
                              hash_exclude=self.config.hash_exclude)
        if self._db is None:
            raise SinkError(f"sink '{self.name}': write_batch before open(); open the sink first")
        try:
            return await self._db.transaction(lambda db: self._write(db, batch))
        except sqlite3.Error as exc:
            raise SinkError(f"sink '{self.name}': batch of {len(batch.records)} records rolled"
                            f" back, {self.path} left as before: {exc}") from exc

    async def count(self) -> int:
        """Rows in the table."""
        if self._db is None:
            raise SinkError(f"sink '{self.name}': count() before open(); open the sink first")
        return int(await self._db.run(
            lambda db: db.execute(f'SELECT count(*) FROM "{self.table}"').fetchone()[0]))

    def _write(self, db: sqlite3.Connection, batch: PreparedBatch) -> BatchResult:
        result = BatchResult(skipped=batch.duplicates)
        keys = [r.key_text for r in batch.records]
        known: dict[str, str] = {}
        for start in range(0, len(keys), _LOOKUP_CHUNK):
            chunk = keys[start:start + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            known.update(db.execute(
                f'SELECT key, hash FROM "{self.table}" WHERE key IN ({marks})', chunk))
        now = time.time()
        rows = []
        for record in batch.records:
            old = known.get(record.key_text)
            if old == record.content_hash:
                result.skipped += 1
                continue
            rows.append((record.key_text, record.full_json(), record.content_hash, now))
            if old is None:
                result.inserted += 1
            else:
                result.updated += 1
        db.executemany(
            f'INSERT INTO "{self.table}" (key, data, hash, written_at) VALUES (?, ?, ?, ?)'
            " ON CONFLICT (key) DO UPDATE SET data = excluded.data, hash = excluded.hash,"
            " written_at = excluded.written_at", rows)
        return result

"""JSON lines sink (the embedded default): one line per new or changed record.

A SQLite sidecar index holds each written key's content hash and the file size of the
last committed batch, so redelivery writes nothing and a half-written batch is cut off.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from crawlhub.errors import SinkError
from crawlhub.sinks.base import BatchResult, SinkConfig
from crawlhub.sinks.records import PreparedBatch, prepare_batch, prepare_record
from crawlhub.storage.sqlite import SqliteDB

log = logging.getLogger(__name__)


class JsonlSinkConfig(SinkConfig):
    """Append-only JSON lines file with a SQLite sidecar index of written keys and hashes."""

    type: Literal["jsonl"] = "jsonl"
    path: Path
    #: Sidecar index; default ``<path>.index.sqlite``.
    index_path: Path | None = None
    fsync: bool = True

    @property
    def index_file(self) -> Path:
        return self.index_path or self.path.with_name(self.path.name + ".index.sqlite")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 1), size INTEGER NOT NULL);
"""
_LOOKUP_CHUNK = 500


class JsonlSink:
    """Appends records as JSON lines; one batch = one fsync'd append + one index commit.

    Order of a batch: append and fsync the lines, then commit the index with the new file
    size. A failure before the commit truncates the file back; a crash before it leaves a
    tail longer than the committed size, which ``open()`` cuts off. A changed record
    appends a new line (the last line of a key is its current version).
    """

    def __init__(self, config: JsonlSinkConfig, *, name: str = "jsonl") -> None:
        self.name = name
        self.config = config
        self.path = Path(config.path)
        self._db: SqliteDB | None = None

    async def open(self) -> None:
        index = self.config.index_file
        fresh_index = not index.exists()
        self._db = SqliteDB(index, schema=_SCHEMA, synchronous="FULL",
                            name=f"sink '{self.name}' index {index}")
        await self._db.run(lambda db: self._open(db, fresh_index))

    async def set_cache_kib(self, kib: int) -> None:
        """Bound the SQLite page cache of this store's connection (see SqliteDB)."""
        if self._db is None:
            raise SinkError(f"sink '{self.name}': set_cache_kib before open(); open the sink"
                            " first")
        await self._db.set_cache_kib(kib)

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        batch = prepare_batch(
            records, self.config.key, sink=self.name, hash_exclude=self.config.hash_exclude
        )
        if self._db is None:
            raise SinkError(f"sink '{self.name}': write_batch before open(); open the sink first")
        return await self._db.run(lambda db: self._write(db, batch))

    async def written(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` (key texts, e.g. URLs for ``key: url``) the file holds (one
        index query per 500 keys): a resumed crawl skips fetching those."""
        if self._db is None:
            raise SinkError(f"sink '{self.name}': written() before open(); open the sink first")
        wanted = list(keys)
        return set(await self._db.run(lambda db: self._known_hashes(db, wanted)))

    # -- blocking parts, run on the index's SQLite thread ------------------------------

    def _open(self, db: sqlite3.Connection, fresh_index: bool) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        committed = db.execute("SELECT size FROM meta WHERE id = 1").fetchone()
        if not self.path.exists():
            self.path.touch()
            _fsync_dir(self.path.parent)
        size = self.path.stat().st_size
        if committed is None:
            if fresh_index and size:
                self._rebuild_index(db)
            else:
                db.execute("INSERT INTO meta (id, size) VALUES (1, ?)", (size,))
            return
        if size > committed[0]:
            log.warning(
                "sink %s: %s has %d bytes past its last committed batch (a crash mid-batch); "
                "cutting them off",
                self.name,
                self.path,
                size - committed[0],
            )
            os.truncate(self.path, committed[0])
        elif size < committed[0]:
            raise SinkError(
                f"sink '{self.name}': {self.path} is shorter ({size} bytes) than its index "
                f"{self.config.index_file} records ({committed[0]}); it was truncated outside crawlhub. Delete "
                f"the index to rebuild it from the file"
            )

    def _rebuild_index(self, db: sqlite3.Connection) -> None:
        """Index an existing file that has no sidecar: the last line of a key wins."""
        hashes: dict[str, str] = {}
        good = 0
        with open(self.path, "rb") as f:
            for number, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    log.warning("sink %s: dropping unfinished last line %d", self.name, number)
                    break
                try:
                    record = prepare_record(
                        json.loads(line),
                        self.config.key,
                        sink=self.name,
                        index=number,
                        hash_exclude=self.config.hash_exclude,
                    )
                except (ValueError, SinkError) as exc:
                    raise SinkError(
                        f"sink '{self.name}': cannot rebuild the index from {self.path} line "
                        f"{number}: {exc}; fix or move the file"
                    ) from exc
                hashes[record.key_text] = record.content_hash
                good += len(line)
        if good < self.path.stat().st_size:
            os.truncate(self.path, good)
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT OR REPLACE INTO entries (key, hash) VALUES (?, ?)", hashes.items())
        db.execute("INSERT INTO meta (id, size) VALUES (1, ?)", (good,))
        db.execute("COMMIT")
        log.info("sink %s: rebuilt index of %d keys from %s", self.name, len(hashes), self.path)

    def _write(self, db: sqlite3.Connection, batch: PreparedBatch) -> BatchResult:
        result = BatchResult(skipped=batch.duplicates)
        db.execute("BEGIN IMMEDIATE")
        size_before: int | None = None
        try:
            known = self._known_hashes(db, [r.key_text for r in batch.records])
            lines: list[bytes] = []
            changes: list[tuple[str, str]] = []
            for record in batch.records:
                old = known.get(record.key_text)
                if old == record.content_hash:
                    result.skipped += 1
                    continue
                lines.append(record.full_json().encode() + b"\n")
                changes.append((record.key_text, record.content_hash))
                if old is None:
                    result.inserted += 1
                else:
                    result.updated += 1
            if lines:
                size_before = db.execute("SELECT size FROM meta WHERE id = 1").fetchone()[0]
                payload = b"".join(lines)
                self._append(payload)
                db.executemany(
                    "INSERT INTO entries (key, hash) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET hash = excluded.hash",
                    changes,
                )
                db.execute("UPDATE meta SET size = ? WHERE id = 1", (size_before + len(payload),))
            db.execute("COMMIT")
        except Exception as exc:
            db.execute("ROLLBACK")
            if size_before is not None:
                os.truncate(self.path, size_before)
            if isinstance(exc, SinkError):
                raise
            raise SinkError(
                f"sink '{self.name}': batch of {len(batch.records)} records rolled back, "
                f"{self.path} left as before: {exc}"
            ) from exc
        return result

    def _append(self, payload: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(payload)
            f.flush()
            if self.config.fsync:
                os.fsync(f.fileno())

    @staticmethod
    def _known_hashes(db: sqlite3.Connection, keys: list[str]) -> dict[str, str]:
        known: dict[str, str] = {}
        for start in range(0, len(keys), _LOOKUP_CHUNK):
            chunk = keys[start : start + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            known.update(db.execute(f"SELECT key, hash FROM entries WHERE key IN ({marks})", chunk))
        return known


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

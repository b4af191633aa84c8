"""JSON lines sink (the embedded default): one line per new or changed record.

A SQLite sidecar index holds each written (record kind, key)'s content hash and the file
size of the last committed batch, so redelivery writes nothing and a half-written batch
is cut off.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from crawlhub.backends.sqlite import SqliteDB
from crawlhub.core.errors import SinkError
from crawlhub.sinks.base import BatchResult, SinkConfig
from crawlhub.sinks.records import PreparedBatch, prepare_batch, prepare_record

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

# ``keyed``: one row per (record kind, key) in the file ('' = no kind: list records,
# crawl items). Indexes of older versions had ``entries`` (key only, so a list row and a
# detail row of one id replaced each other's hash); open() rebuilds those from the file.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS keyed (
  kind TEXT NOT NULL, key TEXT NOT NULL, hash TEXT NOT NULL, PRIMARY KEY (kind, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 1), size INTEGER NOT NULL);
"""
_LOOKUP_CHUNK = 500


class JsonlSink:
    """Appends records as JSON lines; one batch = one fsync'd append + one index commit.

    What a key promises, across batches, runs and crashes: a record is keyed by its
    ``record_kind`` (none for list records, ``detail`` for a job's detail records) and
    its key fields. A (kind, key) already in the file with the same content hash is
    skipped; with a changed hash a new line is appended (the last line of a (kind, key)
    is its current version). So a list row and a detail row of one id are two lines,
    written once each.

    Order of a batch: append and fsync the lines, then commit the index with the new file
    size. A failure before the commit truncates the file back; a crash before it leaves a
    tail longer than the committed size, which ``open()`` cuts off, so a line is never in
    the file without its index row, nor the reverse.
    """

    def __init__(self, config: JsonlSinkConfig, *, name: str = "jsonl") -> None:
        self.name = name
        self.config = config
        self.path = Path(config.path)
        self._db: SqliteDB | None = None

    async def open(self) -> None:
        index = self.config.index_file
        self._db = SqliteDB(index, schema=_SCHEMA, synchronous="FULL",
                            name=f"sink '{self.name}' index {index}")
        await self._db.run(self._open)

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
            records, self.config.key, sink=self.name, hash_exclude=self.config.hash_exclude,
            by_kind=True,
        )
        if self._db is None:
            raise SinkError(f"sink '{self.name}': write_batch before open(); open the sink first")
        return await self._db.run(lambda db: self._write(db, batch))

    async def written(self, keys: Sequence[str], kind: str = "") -> set[str]:
        """Which of ``keys`` (key texts, e.g. URLs for ``key: url``) of record ``kind``
        the file holds (one index query per 500 keys): a resumed crawl skips those."""
        if self._db is None:
            raise SinkError(f"sink '{self.name}': written() before open(); open the sink first")
        wanted = [(kind, key) for key in keys]
        return {key for _, key in await self._db.run(lambda db: self._known_hashes(db, wanted))}

    # -- blocking parts, run on the index's SQLite thread ------------------------------

    def _open(self, db: sqlite3.Connection) -> None:
        """Check the file against its index (cut a crashed batch's tail, rebuild a lost
        index) under the index's write lock: a batch holds it from before its append to
        its commit (``_write``), so a tail past the committed size seen here is a crash's,
        never the lines of another process's batch in flight."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db.execute("BEGIN IMMEDIATE")
        try:
            self._check(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _check(self, db: sqlite3.Connection) -> None:
        committed = db.execute("SELECT size FROM meta WHERE id = 1").fetchone()
        if not self.path.exists():
            self.path.touch()
            _fsync_dir(self.path.parent)
        size = self.path.stat().st_size
        legacy = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'"
        ).fetchone() is not None
        if committed is None:
            # No committed size: a new index, or one whose first open was killed before
            # it indexed the file. Either way the file's lines are indexed from scratch.
            if size or legacy:
                self._rebuild_index(db, drop_legacy=legacy)
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
        if legacy:
            log.info("sink %s: index %s keys by key only (an older crawlhub); rebuilding it "
                     "by (record kind, key) from %s", self.name, self.config.index_file,
                     self.path)
            self._rebuild_index(db, drop_legacy=True)

    def _rebuild_index(self, db: sqlite3.Connection, *, drop_legacy: bool = False) -> None:
        """Index the file's lines (an index lost, never committed, or of an older
        version): the last line of a (kind, key) wins. In ``_open``'s transaction, so a
        kill midway leaves the index as it was and the next open rebuilds again."""
        hashes: dict[tuple[str, str], str] = {}
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
                hashes[record.kind, record.key_text] = record.content_hash
                good += len(line)
        if good < self.path.stat().st_size:
            os.truncate(self.path, good)
        if drop_legacy:
            db.execute("DROP TABLE entries")
        db.execute("DELETE FROM keyed")
        db.executemany("INSERT INTO keyed (kind, key, hash) VALUES (?, ?, ?)",
                       [(kind, key, h) for (kind, key), h in hashes.items()])
        db.execute("INSERT OR REPLACE INTO meta (id, size) VALUES (1, ?)", (good,))
        log.info("sink %s: rebuilt index of %d keys from %s", self.name, len(hashes), self.path)

    def _write(self, db: sqlite3.Connection, batch: PreparedBatch) -> BatchResult:
        result = BatchResult(skipped=batch.duplicates)
        db.execute("BEGIN IMMEDIATE")
        size_before: int | None = None
        try:
            known = self._known_hashes(db, [(r.kind, r.key_text) for r in batch.records])
            lines: list[bytes] = []
            changes: list[tuple[str, str, str]] = []
            for record in batch.records:
                old = known.get((record.kind, record.key_text))
                if old == record.content_hash:
                    result.skipped += 1
                    continue
                lines.append(record.full_json().encode() + b"\n")
                changes.append((record.kind, record.key_text, record.content_hash))
                if old is None:
                    result.inserted += 1
                else:
                    result.updated += 1
            if lines:
                size_before = db.execute("SELECT size FROM meta WHERE id = 1").fetchone()[0]
                payload = b"".join(lines)
                self._append(payload)
                db.executemany(
                    "INSERT INTO keyed (kind, key, hash) VALUES (?, ?, ?) "
                    "ON CONFLICT (kind, key) DO UPDATE SET hash = excluded.hash",
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
    def _known_hashes(
        db: sqlite3.Connection, keys: list[tuple[str, str]]
    ) -> dict[tuple[str, str], str]:
        """The hash of each (kind, key) the index holds: one query per 500 keys."""
        known: dict[tuple[str, str], str] = {}
        for start in range(0, len(keys), _LOOKUP_CHUNK):
            chunk = keys[start : start + _LOOKUP_CHUNK]
            marks = ",".join("(?, ?)" for _ in chunk)
            params = [part for pair in chunk for part in pair]
            rows = db.execute(
                f"SELECT kind, key, hash FROM keyed WHERE (kind, key) IN (VALUES {marks})",
                params,
            )
            known.update(((kind, key), h) for kind, key, h in rows)
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

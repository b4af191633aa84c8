"""One SQLite connection owned by one worker thread, awaited from asyncio.

SQLite calls block; running them all on a single dedicated thread keeps the event loop
free and serialises access to the connection without locks of our own.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def sqlite_path(url: str) -> Path:
    """``sqlite:///rel/path.db`` -> ``rel/path.db``; ``sqlite:////abs/path.db`` -> ``/abs/path.db``."""
    for prefix in ("sqlite+aiosqlite:///", "sqlite:///"):
        if url.startswith(prefix):
            return Path(url[len(prefix) :])
    return Path(url)


class SqliteDB:
    """A SQLite file in WAL mode with one connection on one thread."""

    def __init__(self, url_or_path: str | Path, *, schema: str = "") -> None:
        self.path = sqlite_path(str(url_or_path))
        self._schema = schema
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            if self._schema:
                conn.executescript(self._schema)
            self._conn = conn
        return self._conn

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the database thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(self._connect()))

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` (rollback on error)."""

        def wrapped(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return await self.run(wrapped)

    async def close(self) -> None:
        def _close(_: sqlite3.Connection) -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        if self._conn is not None:
            await self.run(_close)
        self._executor.shutdown(wait=True)

"""The one SQLite runner: a file in WAL mode, one connection owned by one thread, awaited
from asyncio; an unreachable file raises :class:`~crawlhub.core.errors.BackendUnavailable`.

SQLite calls block; running them all on a single dedicated thread keeps the event loop
free and serialises access to the connection without locks of our own. Several
processes may share a file: writes take ``BEGIN IMMEDIATE`` and wait ``busy_timeout``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

from crawlhub.backends.backend import MEMORY, Backend, sqlite_file
from crawlhub.backends.errors import is_unavailable, unavailable

T = TypeVar("T")

BUSY_TIMEOUT = 30.0


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction: ``BEGIN IMMEDIATE`` (takes the write lock now), ``COMMIT`` at
    the end, ``ROLLBACK`` if the block or the commit fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Switch to WAL. Two processes creating the same file at once can get "database is
    locked" here at once, without the busy handler: the switch needs an exclusive lock.
    Retry until ``busy_timeout`` runs out; a file already in WAL needs no switch."""
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class SqliteDB:
    """A SQLite file (or ``:memory:``) with one connection on one thread.

    ``synchronous`` is the SQLite pragma: NORMAL is durable in WAL mode but for the last
    commits before a power loss; FULL (a sink whose file must match its index) is not.
    ``schema`` (statements separated by ``;``) is applied in one ``BEGIN IMMEDIATE``
    transaction when the connection opens, so processes opening the file at once do not
    race. SQLite errors that mean the file is out of reach (cannot be opened, disk I/O,
    locked past the busy timeout, read-only, full) raise ``BackendUnavailable``; other
    errors (bad SQL, constraints) pass through unchanged.
    """

    def __init__(self, url_or_path: str | Path | Backend, *, schema: str = "",
                 busy_timeout: float = BUSY_TIMEOUT, synchronous: str = "NORMAL",
                 name: str = "") -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
        self.path = sqlite_file(url_or_path if isinstance(url_or_path, Backend)
                                else str(url_or_path))
        self.name = name or f"SQLite file {self.path}"
        self._schema = schema
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="crawlhub-sqlite")
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"<SqliteDB {self.path}>"

    async def set_cache_kib(self, kib: int) -> None:
        """Bound this connection's SQLite page cache to ``kib`` KiB (SQLite's default is
        2 MB per connection; the OS caches the file beneath it anyway)."""
        size = int(kib)
        if size <= 0:
            raise ValueError(f"cache size must be positive KiB, not {kib!r}")
        await self.run(lambda conn: conn.execute(f"PRAGMA cache_size = -{size}"))

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != MEMORY:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                   check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
                _wal(conn, self._busy_timeout)
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                if self._schema:
                    # Not executescript(): it would commit; one transaction races nobody.
                    with immediate(conn):
                        for statement in self._schema.split(";"):
                            if statement.strip():
                                conn.execute(statement)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(self._connect())
        except OSError as exc:  # the directory cannot be made: permissions, a file in the way
            raise unavailable(exc, self.name) from exc
        except sqlite3.Error as exc:
            if is_unavailable(exc):
                raise unavailable(exc, self.name) from exc
            raise

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the database thread (autocommit mode)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn)

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` (rollback on error)."""

        def wrapped(conn: sqlite3.Connection) -> T:
            with immediate(conn):
                return fn(conn)

        return await self.run(wrapped)

    async def close(self) -> None:
        """Close the connection and stop the thread; idempotent."""

        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        if self._conn is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, _close)
        self._executor.shutdown(wait=True)

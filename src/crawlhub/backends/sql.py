"""The one SQL runner of the stores that live in SQLite embedded and PostgreSQL
distributed (the collect metadata store, the control plane's stores).

A store writes its SQL once with ``$1, $2`` placeholders (PostgreSQL's; SQLite reads them
as ``?1``) and portable types (TEXT, BIGINT, DOUBLE PRECISION), and runs it through a
:class:`SqlDB`. Table names come from :meth:`SqlDB.table`, so tests (and two deployments
in one database) keep apart with a prefix.

    db = await SqlDB.open("sqlite:///data/control.db")
    await db.schema([f"CREATE TABLE IF NOT EXISTS {db.table('jobs')} (...)"])
    rows = await db.fetch(f"SELECT name FROM {db.table('jobs')} WHERE kind = $1", "crawl")

Backend outages raise :class:`crawlhub.core.errors.BackendUnavailable` (the API answers 503).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self, TypeVar

from crawlhub.backends.backend import Backend
from crawlhub.backends.errors import unavailable
from crawlhub.backends.sqlite import SqliteDB, immediate
from crawlhub.core.errors import ConfigError
from crawlhub.core.redact import redact_url

T = TypeVar("T")

_PLACEHOLDER = re.compile(r"\$(\d+)")
#: A table prefix: a plain SQL identifier start.
TABLE_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")


class SqlDB:
    """One database; ``dialect`` is ``"sqlite"`` or ``"postgresql"``.

    SQLite: one connection on one thread (WAL, busy timeout), so a CLI and a server
    share the file. PostgreSQL: a small asyncpg pool; every statement is its own
    transaction unless run through :meth:`transaction`.
    """

    #: what the database is called in errors, and the config key of its URL
    what = "database"
    key = "url"

    def __init__(self, url: str | Backend, *, prefix: str = "crawlhub_",
                 pool_size: int = 4) -> None:
        check_table_prefix(prefix)
        backend = Backend.parse(url, kinds=("sqlite", "postgres"), what=self.what,
                                key=self.key)
        self.backend = backend
        self.url = str(url)
        self.prefix = prefix
        self.dialect = "sqlite" if backend.kind == "sqlite" else "postgresql"
        self.name = redact_url(self.url)
        self._path = backend.path if backend.kind == "sqlite" else None
        self._dsn = backend.dsn if backend.kind != "sqlite" else None
        self._pool_size = pool_size
        self._sqlite: SqliteDB | None = None
        self._pool: Any = None
        self._sqlite_lock: asyncio.Lock | None = None

    @classmethod
    async def open(cls, url: str | Backend, *, prefix: str = "crawlhub_") -> Self:
        db = cls(url, prefix=prefix)
        await db.connect()
        return db

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def table(self, name: str) -> str:
        """The real name of table ``name`` (the prefix added)."""
        return f"{self.prefix}{name}"

    async def connect(self) -> None:
        if self.dialect == "sqlite":
            if self._sqlite is None:
                self._sqlite = SqliteDB(str(self._path), name=f"{self.what} {self._path}")
                await self._sqlite.run(lambda conn: None)  # a bad path fails here
            return
        if self._pool is None:
            asyncpg = self.backend.require(f"the PostgreSQL {self.what}")
            try:
                self._pool = await asyncpg.create_pool(self._dsn, min_size=1,
                                                       max_size=self._pool_size)
            except (OSError, asyncpg.PostgresError) as exc:
                raise unavailable(exc, self.name) from exc

    async def close(self) -> None:
        db, self._sqlite = self._sqlite, None
        if db is not None:
            await db.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # -- statements ---------------------------------------------------------------------
    async def schema(self, statements: Sequence[str]) -> None:
        """Run DDL statements (``CREATE ... IF NOT EXISTS``) in one transaction."""
        if self.dialect == "sqlite":
            def apply(conn: sqlite3.Connection) -> None:
                with immediate(conn):
                    for statement in statements:
                        conn.execute(statement)

            async with self._lock():
                await self._lite().run(apply)
            return
        async with self._pg().acquire() as conn:
            async with conn.transaction():
                # Two processes creating the same tables at once: serialise them.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.prefix)
                for statement in statements:
                    await conn.execute(statement)

    async def execute(self, sql: str, *args: Any) -> int:
        """Run one statement; the number of rows it changed."""
        if self.dialect == "sqlite":
            query = _PLACEHOLDER.sub(r"?\1", sql)

            def run(conn: sqlite3.Connection) -> int:
                cursor = conn.execute(query, args)
                try:
                    return cursor.rowcount
                finally:
                    cursor.close()

            async with self._lock():
                return await self._lite().run(run)
        status = await self._pg_call("execute", sql, *args)
        tail = str(status).rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    async def fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """The rows of a query (or of a writing statement with RETURNING, committed)."""
        if self.dialect == "sqlite":
            query = _PLACEHOLDER.sub(r"?\1", sql)
            if _writes(query):
                def write(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
                    with immediate(conn):
                        return [tuple(r) for r in conn.execute(query, args).fetchall()]

                async with self._lock():
                    return await self._lite().run(write)
            async with self._lock():
                return await self._lite().run(
                    lambda conn: [tuple(r) for r in conn.execute(query, args).fetchall()])
        rows = await self._pg_call("fetch", sql, *args)
        return [tuple(r) for r in rows]

    async def fetchone(self, sql: str, *args: Any) -> tuple[Any, ...] | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement over many rows, in one transaction."""
        if not rows:
            return
        if self.dialect == "sqlite":
            query = _PLACEHOLDER.sub(r"?\1", sql)

            def write(conn: sqlite3.Connection) -> None:
                with immediate(conn):
                    conn.executemany(query, rows)

            async with self._lock():
                await self._lite().run(write)
            return
        await self._pg_call("executemany", sql, rows)

    async def transaction(self, steps: Callable[[Tx], Awaitable[T]], *,
                          lock: str | None = None) -> T:
        """Run ``await steps(tx)`` in one transaction; ``tx`` has ``execute`` and
        ``fetch`` like this class.

        Read-then-write steps (count the running instances, then insert a run) need
        ``lock``, a name: PostgreSQL then holds an advisory lock on it until the end, so
        two transactions with the same ``lock`` run one after the other. SQLite always
        takes the write lock first (``BEGIN IMMEDIATE``) and this process's other
        statements wait for the end, so every transaction is serialised there."""
        if self.dialect == "sqlite":
            lite = self._lite()
            async with self._lock():
                await lite.run(lambda conn: conn.execute("BEGIN IMMEDIATE").close())
                try:
                    result = await steps(_LiteTx(lite))
                    await lite.run(lambda conn: conn.execute("COMMIT").close())
                except BaseException:
                    await lite.run(_rollback)
                    raise
                return result
        async with self._pg().acquire() as conn:
            async with conn.transaction():
                if lock is not None:
                    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                                       f"{self.prefix}{lock}")
                return await steps(_PgTx(conn))

    def _lock(self) -> asyncio.Lock:
        if self._sqlite_lock is None:
            self._sqlite_lock = asyncio.Lock()
        return self._sqlite_lock

    # -- backends -----------------------------------------------------------------------
    def _lite(self) -> SqliteDB:
        if self._sqlite is None:
            raise RuntimeError(f"{self!r} used before connect()")
        return self._sqlite

    def _pg(self) -> Any:
        if self._pool is None:
            raise RuntimeError(f"{self!r} used before connect()")
        return self._pool

    async def _pg_call(self, method: str, sql: str, *args: Any) -> Any:
        asyncpg = self.backend.require(f"the PostgreSQL {self.what}")
        try:
            return await getattr(self._pg(), method)(sql, *args)
        except (OSError, asyncpg.exceptions.ConnectionDoesNotExistError,
                asyncpg.exceptions.CannotConnectNowError,
                asyncpg.exceptions.InterfaceError) as exc:
            raise unavailable(exc, self.name) from exc


def check_table_prefix(prefix: str) -> str:
    """``prefix``, or a :class:`ConfigError` when it is not a plain SQL identifier."""
    if not TABLE_PREFIX_RE.match(prefix):
        raise ConfigError(f"table prefix {prefix!r} is not a plain SQL identifier; use"
                          " letters, digits and underscores", key="table_prefix")
    return prefix


def _writes(query: str) -> bool:
    head = query.lstrip().split(None, 1)[0].upper() if query.strip() else ""
    return head in ("INSERT", "UPDATE", "DELETE", "REPLACE", "WITH")


class Tx:
    """What :meth:`SqlDB.transaction` hands its steps."""

    async def execute(self, sql: str, *args: Any) -> int:
        raise NotImplementedError

    async def fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError


class _PgTx(Tx):
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def execute(self, sql: str, *args: Any) -> int:
        status = await self._conn.execute(sql, *args)
        tail = str(status).rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    async def fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await self._conn.fetch(sql, *args)]


class _LiteTx(Tx):
    def __init__(self, lite: SqliteDB) -> None:
        self._lite = lite

    async def execute(self, sql: str, *args: Any) -> int:
        query = _PLACEHOLDER.sub(r"?\1", sql)
        return await self._lite.run(lambda conn: conn.execute(query, args).rowcount)

    async def fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        query = _PLACEHOLDER.sub(r"?\1", sql)
        return await self._lite.run(
            lambda conn: [tuple(r) for r in conn.execute(query, args).fetchall()])


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")

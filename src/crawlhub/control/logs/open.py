"""The log store of a :class:`~crawlhub.control.db.ControlDB`: FTS5 on SQLite, full text
on PostgreSQL (the factory, apart from the protocol and the backends)."""

from __future__ import annotations

from crawlhub.control.db import ControlDB
from crawlhub.control.logs.store import LogStore


def open_log_store(db: ControlDB, *, table: str = "log_lines") -> LogStore:
    """The store on ``db`` (not yet :meth:`~LogStore.open`-ed: call it to create the
    tables); it closes ``db`` when closed."""
    if db.dialect == "sqlite":
        from crawlhub.control.logs.sqlite import SqliteLogStore

        return SqliteLogStore(db, table=table)
    from crawlhub.control.logs.postgres import PostgresLogStore

    return PostgresLogStore(db, table=table)

"""The log store of a :class:`~crawlhub.control.db.ControlDB`: FTS5 on SQLite, full text
on PostgreSQL (the factory, apart from the protocol and the backends)."""

from __future__ import annotations

from crawlhub.control.db import ControlDB
from crawlhub.control.logs.store import LogStore

#: The log store on each kind of database (imported when chosen).
STORES = {
    "sqlite": "crawlhub.control.logs.sqlite:SqliteLogStore",
    "postgres": "crawlhub.control.logs.postgres:PostgresLogStore",
}


def open_log_store(db: ControlDB, *, table: str = "log_lines") -> LogStore:
    """The store on ``db`` (not yet :meth:`~LogStore.open`-ed: call it to create the
    tables); it closes ``db`` when closed."""
    store: LogStore = db.backend.load(STORES, needed_by=f"the PostgreSQL {db.what}")(
        db, table=table)
    return store

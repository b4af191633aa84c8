"""Fixtures of the log store's tests: a store on real SQLite and PostgreSQL, lines."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest

from crawlhub.control.db import ControlDB
from crawlhub.control.logs import LogLine, LogStore, open_log_store
from crawlhub.control.logs.text import clean_line


@pytest.fixture
async def log_store(control_db: ControlDB) -> AsyncIterator[LogStore]:
    """An opened log store on each backend (``control_db``: a fresh SQLite file, or the
    test PostgreSQL with this test's table prefix, dropped afterwards)."""
    store = open_log_store(control_db)
    await store.open()
    yield store


MakeLine = Callable[..., LogLine]


@pytest.fixture
def line() -> MakeLine:
    """``line("text", job="j", level="error", ...)``: a cleaned line stamped now."""

    def make(message: str, **fields: object) -> LogLine:
        fields.setdefault("ts", time.time())
        return clean_line(LogLine(message=message, **fields))  # type: ignore[arg-type]

    return make

"""Fixtures of the log store's tests: a store on real SQLite and PostgreSQL, a SQLite
store in the test's data dir, lines."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from crawlhub.control.db import ControlDB
from crawlhub.control.logs import LogLine, LogQuery, LogService, LogStore, open_log_store
from crawlhub.control.logs.text import clean_line


@pytest.fixture
async def log_store(control_db: ControlDB) -> AsyncIterator[LogStore]:
    """An opened log store on each backend (``control_db``: a fresh SQLite file, or the
    test PostgreSQL with this test's table prefix, dropped afterwards)."""
    store = open_log_store(control_db)
    await store.open()
    yield store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LogStore]:
    """An opened SQLite store in ``tmp_path/logs.db``: the file of the default config
    with ``data_dir: tmp_path`` (what ``crawlhub logs --data-dir tmp_path`` reads)."""
    s = open_log_store(await ControlDB.open(f"sqlite:///{tmp_path}/logs.db"))
    await s.open()
    yield s
    await s.close()


async def messages(logs: LogStore | LogService, **query: object) -> list[str]:
    """The messages of a search, in the order they come."""
    page = await logs.search(LogQuery(**query))  # type: ignore[arg-type]
    return [line.message for line in page.lines]


MakeLine = Callable[..., LogLine]


@pytest.fixture
def line() -> MakeLine:
    """``line("text", job="j", level="error", ...)``: a cleaned line stamped now."""

    def make(message: str, **fields: object) -> LogLine:
        fields.setdefault("ts", time.time())
        return clean_line(LogLine(message=message, **fields))  # type: ignore[arg-type]

    return make

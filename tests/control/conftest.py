"""Fixtures of the control plane's tests: a ControlDB on real SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.control.db import ControlDB


@pytest.fixture(params=["sqlite", "postgres"])
async def control_db(request: pytest.FixtureRequest, tmp_path: Path,
                     unique_name: str) -> AsyncIterator[ControlDB]:
    """A ControlDB on a fresh SQLite file, or on the test PostgreSQL server with table
    names of this test only (dropped afterwards)."""
    if request.param == "sqlite":
        db = await ControlDB.open(f"sqlite:///{tmp_path}/control.db")
        yield db
        await db.close()
        return
    url = request.getfixturevalue("postgres_url")
    prefix = f"{unique_name}_"
    db = await ControlDB.open(url, prefix=prefix)
    try:
        yield db
    finally:
        await drop_tables(db)
        await db.close()


async def drop_tables(db: ControlDB) -> None:
    """Drop every PostgreSQL table of ``db``'s prefix (the test's own)."""
    rows = await db.fetch("SELECT tablename FROM pg_tables WHERE tablename LIKE $1",
                          db.prefix.replace("_", r"\_") + "%")
    for (name,) in rows:
        await db.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')

"""Pipeline tests: the real paged JSON API and a real SQLite sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.httpapi import api_server  # noqa: F401 - a fixture
from tests.pipeline.sqlite_sink import SqliteSink


@pytest.fixture
def sqlite_sink(tmp_path: Path, unique_name: str) -> SqliteSink:
    return SqliteSink(tmp_path / "records.db", table=unique_name)

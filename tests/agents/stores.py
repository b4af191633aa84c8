"""Fixtures for the registry and domain gate suites: each test runs once on a SQLite
file and once on real Redis under a prefix of its own (its keys deleted afterwards). A suite
imports ``backend_fixture`` to get the ``backend`` fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.queues.conftest import delete_prefix

BACKENDS = ["sqlite", "redis"]


@dataclass
class Backend:
    """Where a test opens its registries / gates: a URL and, on Redis, a key prefix."""

    kind: str
    url: str
    prefix: str


@pytest.fixture(name="backend", params=BACKENDS)
async def backend_fixture(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
                  ) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite:///{tmp_path}/agents.db", "")
        return
    b = Backend("redis", request.getfixturevalue("redis_url"), f"test:{unique_name}:")
    yield b
    await delete_prefix(b.url, b.prefix)

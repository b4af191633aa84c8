"""Frontier fixtures: frontiers on real SQLite files and a real Redis (unique prefixes),
with a settable clock so segments and leases can be walked through without sleeping."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from crawlhub.frontier import Frontier, build_frontier
from crawlhub.frontier.config import FrontierConfig
from tests.helpers import FakeClock

BACKENDS = ["sqlite", "redis"]
#: 2023-11-14 22:13:20 UTC: inside a day segment, 6h before its end is not an edge case
T0 = 1_700_000_000.0
DAY = 86400.0


MakeFrontier = Callable[..., Awaitable[Frontier]]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def storage_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "redis":
        return str(request.getfixturevalue("redis_url"))
    return f"sqlite:///{tmp_path}/frontier.db"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
async def make_frontier(
    storage_url: str, unique_name: str, clock: FakeClock
) -> AsyncIterator[MakeFrontier]:
    """Build and open a frontier on the parametrised backend; every one is closed and
    its Redis keys deleted at the end. Options are FrontierConfig fields."""
    made: list[Frontier] = []
    prefix = f"{unique_name}:"

    async def make(name: str = "f", *, clock_: Callable[[], float] | None = None,
                   **options: Any) -> Frontier:
        config = FrontierConfig.model_validate({"snapshot_interval": 0, **options})
        frontier = build_frontier(name, config, storage_url, prefix=prefix,
                                  clock=clock_ or clock)
        await frontier.open()
        made.append(frontier)
        return frontier

    yield make
    for frontier in made:
        with contextlib.suppress(Exception):
            await frontier.close()
    if storage_url.startswith("redis"):
        client = aioredis.Redis.from_url(storage_url)
        try:
            async for key in client.scan_iter(match=f"{prefix}*", count=1000):
                await client.delete(key)
        finally:
            await client.aclose()

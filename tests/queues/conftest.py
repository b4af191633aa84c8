"""Fixtures of the queue suites: each test runs once on SQLite and once on real Redis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from crawlhub.queues import QueueBackend, ReliableQueue
from crawlhub.queues.redis import RedisQueueBackend
from crawlhub.queues.sqlite import SqliteQueueBackend
from tests.helpers import FakeClock

BACKENDS = ["sqlite", "redis"]


@dataclass
class Store:
    """One storage (a SQLite file, or a key prefix on Redis) that tests open backends on."""

    kind: str
    url: str
    prefix: str
    opened: list[QueueBackend] = field(default_factory=list)

    def open(self, clock: Callable[[], float] | None = None) -> QueueBackend:
        backend: QueueBackend
        if self.kind == "sqlite":
            backend = SqliteQueueBackend(self.url, clock=clock or time.time)
        else:
            backend = RedisQueueBackend(self.url, prefix=self.prefix, clock=clock)
        self.opened.append(backend)
        return backend


async def delete_prefix(url: str, prefix: str) -> None:
    """Remove every key a test wrote under its own prefix (never anything else)."""
    client = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> Store:
    if kind == "sqlite":
        return Store("sqlite", f"sqlite:///{tmp_path}/queues/q.db", "")
    return Store("redis", request.getfixturevalue("redis_url"), f"test:{name}:")


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> AsyncIterator[Store]:
    s = make_store(request.param, request, tmp_path, unique_name)
    yield s
    for backend in s.opened:
        await backend.close()
    if s.kind == "redis":
        await delete_prefix(s.url, s.prefix)


@pytest.fixture
def backend(store: Store) -> QueueBackend:
    return store.open()


@pytest.fixture
def queue(backend: QueueBackend, unique_name: str) -> ReliableQueue:
    return backend.queue(unique_name)


@pytest.fixture
def timed_queue(store: Store, clock: FakeClock, unique_name: str) -> ReliableQueue:
    """A queue whose lease deadlines follow ``clock`` instead of real time."""
    return store.open(clock=clock).queue(unique_name)

"""``open_backend`` picks the backend from the URL scheme."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlhub.core.errors import ConfigError
from crawlhub.queues import QueueBackend, ReliableQueue, open_backend
from crawlhub.queues.redis import RedisQueueBackend
from crawlhub.queues.sqlite import SqliteQueueBackend


async def test_sqlite_url_opens_the_embedded_backend(tmp_path: Path) -> None:
    backend = open_backend(f"sqlite:///{tmp_path}/q.db")
    try:
        assert isinstance(backend, SqliteQueueBackend)
        assert isinstance(backend, QueueBackend)
        assert isinstance(backend.queue("jobs"), ReliableQueue)
    finally:
        await backend.close()


async def test_redis_url_opens_the_distributed_backend_with_its_prefix() -> None:
    backend = open_backend("redis://127.0.0.1:6379/0", prefix="mine:")
    try:
        assert isinstance(backend, RedisQueueBackend)
        assert backend.prefix == "mine:"
        assert isinstance(backend.queue("jobs"), ReliableQueue)
    finally:
        await backend.close()


def test_unknown_scheme_names_the_accepted_forms() -> None:
    with pytest.raises(ConfigError, match=r"accepted: sqlite://, .*valkeys://") as e:
        open_backend("amqp://localhost/")
    assert e.value.key == "storage.queues"


async def test_valkeys_and_unix_schemes_open_the_redis_backend() -> None:
    for url in ("valkeys://127.0.0.1:6379/0", "unix:///tmp/redis.sock?db=0"):
        backend = open_backend(url)
        try:
            assert isinstance(backend, RedisQueueBackend)
        finally:
            await backend.close()

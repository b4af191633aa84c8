"""Reliable priority queues: one protocol, a SQLite and a Redis backend."""

from crawlhub.core.extras import require
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.queues.base import Message, QueueBackend, QueueStats, ReliableQueue

__all__ = ["Message", "QueueBackend", "QueueStats", "ReliableQueue", "open_backend"]


def open_backend(url: str, *, prefix: str = DEFAULT_PREFIX) -> QueueBackend:
    """Open the queue backend named by ``url``.

    ``sqlite:///path/to/queues.db`` (embedded) or ``redis://host:port/db`` (distributed);
    ``prefix`` starts every Redis key (unused by SQLite).
    """
    from crawlhub.backends.urls import parse_backend_url

    backend = parse_backend_url(url, kinds=("sqlite", "redis"), what="queue backend",
                                key="storage.queues")
    if backend.kind == "sqlite":
        from crawlhub.queues.sqlite import SqliteQueueBackend

        return SqliteQueueBackend(url)
    require("redis", "redis", needed_by="the Redis queue backend (storage.queues)")
    from crawlhub.queues.redis import RedisQueueBackend

    return RedisQueueBackend(url, prefix=prefix)

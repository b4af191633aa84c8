"""Reliable priority queues: one protocol, a SQLite and a Redis backend."""

from crawlhub.keys import DEFAULT_PREFIX
from crawlhub.queues.base import Message, QueueBackend, QueueStats, ReliableQueue

__all__ = ["Message", "QueueBackend", "QueueStats", "ReliableQueue", "open_backend"]


def open_backend(url: str, *, prefix: str = DEFAULT_PREFIX) -> QueueBackend:
    """Open the queue backend named by ``url``.

    ``sqlite:///path/to/queues.db`` (embedded) or ``redis://host:port/db`` (distributed);
    ``prefix`` starts every Redis key (unused by SQLite).
    """
    if url.startswith("sqlite"):
        from crawlhub.queues.sqlite import SqliteQueueBackend

        return SqliteQueueBackend(url)
    if url.startswith(("redis://", "rediss://", "unix://", "valkey://")):
        from crawlhub.queues.redis import RedisQueueBackend

        return RedisQueueBackend(url, prefix=prefix)
    from crawlhub.errors import QueueError

    raise QueueError(
        f"unknown queue backend URL {url!r}: use sqlite:///path/queues.db or redis://host:port/0"
    )

"""Reliable priority queues: one protocol, a SQLite and a Redis backend."""

from crawlhub.backends.backend import Backend
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.queues.base import Message, QueueBackend, QueueStats, ReliableQueue

__all__ = ["Message", "QueueBackend", "QueueStats", "ReliableQueue", "open_backend"]

#: The queue backend of each kind of storage (imported when chosen).
BACKENDS = {
    "sqlite": "crawlhub.queues.sqlite:SqliteQueueBackend",
    "redis": "crawlhub.queues.redis:RedisQueueBackend",
}


def open_backend(url: str | Backend, *, prefix: str = DEFAULT_PREFIX) -> QueueBackend:
    """Open the queue backend named by ``url``.

    ``sqlite:///path/to/queues.db`` (embedded) or ``redis://host:port/db`` (distributed);
    ``prefix`` starts every Redis key (unused by SQLite).
    """
    backend = Backend.parse(url, kinds=BACKENDS, what="queue backend", key="storage.queues")
    queues: QueueBackend = backend.open(
        BACKENDS, needed_by="the Redis queue backend (storage.queues)",
        redis={"prefix": prefix})
    return queues

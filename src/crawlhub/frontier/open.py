"""Opening a frontier's seed store from a URL: the one place that knows the backends, so
the protocol (:mod:`crawlhub.frontier.store`) and its backends import only downward."""

from __future__ import annotations

from crawlhub.backends.backend import Backend
from crawlhub.frontier.store import SeedStore

#: The seed store of each kind of storage (imported when chosen).
STORES = {
    "sqlite": "crawlhub.frontier.sqlite:SqliteSeedStore",
    "redis": "crawlhub.frontier.redis:RedisSeedStore",
}


def open_store(
    url: str | Backend,
    name: str,
    *,
    prefix: str,
    expected_items: int,
    fp_rate: float,
    archive: bool = True,
    lifo: bool = False,
) -> SeedStore:
    """The store for frontier ``name`` on ``url`` (``sqlite:///...`` or ``redis://...``).

    ``archive=False`` (Redis): a seed finished ok or failed drops its record; the embedded
    table keeps its rows, which are its filter's write-ahead log. ``lifo``: seeds of one
    priority are claimed newest first (Scrapy's default order) instead of oldest first."""
    backend = Backend.parse(url, kinds=STORES, what="frontier storage", key="storage.frontier")
    store: SeedStore = backend.open(
        STORES, name, expected_items=expected_items, fp_rate=fp_rate,
        needed_by="the Redis frontier store (storage.frontier)",
        redis={"prefix": prefix, "archive": archive, "lifo": lifo},
        sqlite={"lifo": lifo} if lifo else None)
    return store

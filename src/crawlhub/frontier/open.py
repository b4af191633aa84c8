"""Opening a frontier's seed store from a URL: the one place that knows the backends, so
the protocol (:mod:`crawlhub.frontier.store`) and its backends import only downward."""

from __future__ import annotations

from crawlhub.frontier.store import SeedStore


def open_store(
    url: str,
    name: str,
    *,
    prefix: str,
    expected_items: int,
    fp_rate: float,
    archive: bool = True,
) -> SeedStore:
    """The store for frontier ``name`` on ``url`` (``sqlite:///...`` or ``redis://...``).

    ``archive=False`` (Redis): a seed finished ok or failed drops its record; the embedded
    table keeps its rows, which are its filter's write-ahead log."""
    from crawlhub.backends.urls import parse_backend_url

    backend = parse_backend_url(url, kinds=("sqlite", "redis"), what="frontier storage",
                                key="storage.frontier")
    if backend.kind == "sqlite":
        from crawlhub.frontier.sqlite import SqliteSeedStore

        return SqliteSeedStore(url, name, expected_items=expected_items, fp_rate=fp_rate)
    from crawlhub.core.extras import require

    require("redis", "redis", needed_by="the Redis frontier store (storage.frontier)")
    from crawlhub.frontier.redis import RedisSeedStore

    return RedisSeedStore(url, name, prefix=prefix, expected_items=expected_items,
                          fp_rate=fp_rate, archive=archive)

"""Metadata store of collection jobs, chosen by URL.

``sqlite:///path/to/file.db`` (embedded default) or ``postgresql://...``.
"""

from __future__ import annotations

from pathlib import Path

from crawlhub.collect.store.base import (
    Lease,
    MetadataStore,
    Progress,
    RunRecord,
    SqlMetadataStore,
)
from crawlhub.errors import ConfigError

__all__ = ["Lease", "MetadataStore", "Progress", "RunRecord", "SqlMetadataStore", "open_store", "store_for"]


def store_for(url: str, *, table_prefix: str = "crawlhub_collect_") -> SqlMetadataStore:
    """The store a ``storage.metadata`` URL names (not opened yet)."""
    if url.startswith("sqlite://"):
        from crawlhub.collect.store.sqlite import SqliteMetadataStore

        rest = url[len("sqlite://") :]
        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise ConfigError(
                f"metadata URL {url!r} has no file path; write sqlite:///data/meta.db",
                key="storage.metadata",
            )
        return SqliteMetadataStore(
            Path(path) if path != ":memory:" else path, table_prefix=table_prefix
        )
    if url.startswith(("postgresql://", "postgres://", "postgresql+asyncpg://")):
        from crawlhub.collect.store.postgres import PostgresMetadataStore

        return PostgresMetadataStore(
            url.replace("postgresql+asyncpg://", "postgresql://", 1), table_prefix=table_prefix
        )
    raise ConfigError(
        f"metadata URL {url!r} is neither sqlite:///... nor postgresql://...",
        key="storage.metadata",
    )


async def open_store(url: str, *, table_prefix: str = "crawlhub_collect_") -> SqlMetadataStore:
    """``store_for`` then ``open()``: tables are created if missing (idempotent)."""
    store = store_for(url, table_prefix=table_prefix)
    await store.open()
    return store

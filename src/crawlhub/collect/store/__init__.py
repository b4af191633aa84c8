"""Metadata store of collection jobs, chosen by URL.

``sqlite:///path/to/file.db`` (embedded default) or ``postgresql://...``.
"""

from __future__ import annotations

from crawlhub.collect.store.base import (
    Lease,
    MetadataStore,
    Progress,
    RunRecord,
    SqlMetadataStore,
)
from crawlhub.storage.urls import parse_backend_url

__all__ = ["Lease", "MetadataStore", "Progress", "RunRecord", "SqlMetadataStore", "open_metadata_store", "store_for"]


def store_for(url: str, *, table_prefix: str = "crawlhub_collect_") -> SqlMetadataStore:
    """The store a ``storage.metadata`` URL names (not opened yet)."""
    backend = parse_backend_url(url, kinds=("sqlite", "postgres"), what="metadata",
                                key="storage.metadata")
    if backend.kind == "sqlite":
        from crawlhub.collect.store.sqlite import SqliteMetadataStore

        return SqliteMetadataStore(backend.path, table_prefix=table_prefix)
    from crawlhub.collect.store.postgres import PostgresMetadataStore

    return PostgresMetadataStore(backend.dsn, table_prefix=table_prefix)


async def open_metadata_store(url: str, *, table_prefix: str = "crawlhub_collect_") -> SqlMetadataStore:
    """``store_for`` then ``open()``: tables are created if missing (idempotent)."""
    store = store_for(url, table_prefix=table_prefix)
    await store.open()
    return store

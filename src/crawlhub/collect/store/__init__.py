"""Metadata store of collection jobs, chosen by URL.

``sqlite:///path/to/file.db`` (embedded default) or ``postgresql://...``.
"""

from __future__ import annotations

from crawlhub.collect.store.base import (
    JobRunRecord,
    Lease,
    MetadataStore,
    Progress,
    SqlMetadataStore,
)

__all__ = ["JobRunRecord", "Lease", "MetadataStore", "Progress", "SqlMetadataStore", "open_metadata_store", "store_for"]


def store_for(url: str, *, table_prefix: str = "crawlhub_collect_") -> SqlMetadataStore:
    """The store a ``storage.metadata`` URL names (not opened yet)."""
    return SqlMetadataStore(url, table_prefix=table_prefix)


async def open_metadata_store(url: str, *, table_prefix: str = "crawlhub_collect_") -> SqlMetadataStore:
    """``store_for`` then ``open()``: tables are created if missing (idempotent)."""
    store = store_for(url, table_prefix=table_prefix)
    await store.open()
    return store

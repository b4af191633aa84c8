"""Moved to :mod:`crawlhub.storage.sqlite`, the one SQLite runner; kept for old imports."""

from crawlhub.storage.sqlite import SqliteDB, sqlite_path

__all__ = ["SqliteDB", "sqlite_path"]

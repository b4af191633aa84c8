"""One storage layer: backend URLs, client factories and the backend-error table.

Every module that talks to Redis, PostgreSQL or a SQLite file goes through here, so an
outage looks the same everywhere: :class:`~crawlhub.errors.BackendUnavailable`.

- :func:`parse_backend_url`: which backend a URL names (the schemes every factory accepts)
- :func:`redis_client`: the one Redis/Valkey client factory (timeouts, retries, logging)
- :class:`SqliteDB`: the one SQLite runner (WAL, one thread, busy timeout)
- :func:`backend_errors` / :func:`is_unavailable` / :func:`unavailable`: outages
"""

from crawlhub.storage.errors import backend_errors, is_unavailable, unavailable
from crawlhub.storage.redis import redis_client
from crawlhub.storage.sqlite import SqliteDB
from crawlhub.storage.urls import BackendURL, BackendURLError, parse_backend_url

__all__ = [
    "BackendURL",
    "BackendURLError",
    "SqliteDB",
    "backend_errors",
    "is_unavailable",
    "parse_backend_url",
    "redis_client",
    "unavailable",
]

"""One storage layer: backend URLs, client factories and the backend-error table.

Every module that talks to Redis, PostgreSQL or a SQLite file goes through here, so an
outage looks the same everywhere: :class:`~crawlhub.core.errors.BackendUnavailable`.

- :func:`parse_backend_url`: which backend a URL names (the schemes every factory accepts)
- :func:`redis_client`: the one Redis/Valkey client factory (timeouts, retries, logging)
- :class:`SqliteDB`: the one SQLite runner (WAL, one thread, busy timeout)
- :func:`backend_errors` / :func:`is_unavailable` / :func:`unavailable`: outages
"""

from crawlhub.backends.errors import backend_errors, is_unavailable, unavailable
from crawlhub.backends.redis import redis_client
from crawlhub.backends.sqlite import SqliteDB
from crawlhub.backends.urls import BackendURL, BackendURLError, parse_backend_url

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

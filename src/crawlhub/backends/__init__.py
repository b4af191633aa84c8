"""One storage layer: backend URLs, client factories and the backend-error table.

Every module that talks to Redis, PostgreSQL or a SQLite file goes through here, so an
outage looks the same everywhere: :class:`~crawlhub.core.errors.BackendUnavailable`.

- :class:`Backend`: which backend a URL names (the schemes every factory accepts), parsed
  once; :meth:`Backend.open` builds a component's implementation for it
- :func:`lua`: the Lua scripts a module sends to Redis, from its package's ``lua/`` folder
- :func:`redis_client`: the one Redis/Valkey client factory (timeouts, retries, logging)
- :class:`SqliteDB`: the one SQLite runner (WAL, one thread, busy timeout)
- :func:`backend_errors` / :func:`is_unavailable` / :func:`unavailable`: outages
"""

from crawlhub.backends.backend import Backend, BackendURLError
from crawlhub.backends.errors import backend_errors, is_unavailable, unavailable
from crawlhub.backends.redis import lua, redis_client
from crawlhub.backends.sqlite import SqliteDB

__all__ = [
    "Backend",
    "BackendURLError",
    "SqliteDB",
    "backend_errors",
    "is_unavailable",
    "lua",
    "redis_client",
    "unavailable",
]

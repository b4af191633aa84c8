"""One storage layer: backend URLs, client factories and the backend-error table.

Every module that talks to Redis, PostgreSQL or a SQLite file goes through here, so an
outage looks the same everywhere: :class:`~crawlhub.errors.BackendUnavailable`.
"""

from crawlhub.storage.errors import backend_errors, is_unavailable, unavailable

__all__ = ["backend_errors", "is_unavailable", "unavailable"]

"""The one table that maps backend client errors to crawlhub's errors.

Redis, asyncpg and sqlite3 each raise their own exception types when a server is down,
refuses a login or a file cannot be opened. Callers wrap backend calls in
:func:`backend_errors` (or test with :func:`is_unavailable`) so all of them surface as
:class:`BackendUnavailable`, which the API answers with 503 and ``Retry-After``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from crawlhub.core.errors import BackendUnavailable, CrawlhubError

RETRY_AFTER = 1.0

# sqlite3.OperationalError messages that mean "the file is out of reach", not "bad SQL".
_SQLITE_UNAVAILABLE = ("unable to open database file", "disk i/o error", "database is locked",
                       "readonly database", "database or disk is full")


def _unavailable_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        import redis.exceptions as rex

        types += [rex.ConnectionError, rex.TimeoutError, rex.AuthenticationError,
                  rex.BusyLoadingError]
    except ImportError:  # pragma: no cover - the redis extra is not installed
        pass
    try:
        import asyncpg

        types += [asyncpg.exceptions.PostgresConnectionError,
                  asyncpg.exceptions.CannotConnectNowError,
                  asyncpg.exceptions.InvalidPasswordError,
                  asyncpg.exceptions.InvalidAuthorizationSpecificationError,
                  asyncpg.exceptions.InterfaceError]
    except ImportError:  # pragma: no cover - the postgres extra is not installed
        pass
    return tuple(types)


_TYPES: tuple[type[BaseException], ...] | None = None


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the backend is out of reach (retrying later may work)."""
    global _TYPES
    if isinstance(exc, BackendUnavailable):
        return True
    if isinstance(exc, CrawlhubError):
        cause = exc.__cause__
        return cause is not None and cause is not exc and is_unavailable(cause)
    if _TYPES is None:
        _TYPES = _unavailable_types()
    if isinstance(exc, _TYPES):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(marker in text for marker in _SQLITE_UNAVAILABLE)
    return False


def unavailable_types() -> tuple[type[BaseException], ...]:
    """The raw client error types :func:`is_unavailable` may say yes to (besides
    crawlhub's own errors caused by one), e.g. to register exception handlers for."""
    global _TYPES
    if _TYPES is None:
        _TYPES = _unavailable_types()
    return (*_TYPES, sqlite3.OperationalError)


def unavailable(exc: BaseException, backend: str = "") -> BackendUnavailable:
    """The :class:`BackendUnavailable` for a backend error (``backend``: a redacted name)."""
    if isinstance(exc, BackendUnavailable):
        return exc
    where = f" {backend}" if backend else ""
    error = BackendUnavailable(f"backend{where} is unavailable: {type(exc).__name__}: {exc};"
                               " retry later", backend=backend, retry_after=RETRY_AFTER)
    error.__cause__ = exc
    return error


@contextmanager
def backend_errors(backend: str = "") -> Iterator[None]:
    """Re-raise backend outages inside the block as :class:`BackendUnavailable`."""
    try:
        yield
    except BackendUnavailable:
        raise
    except Exception as exc:
        if is_unavailable(exc):
            raise unavailable(exc, backend) from exc
        raise

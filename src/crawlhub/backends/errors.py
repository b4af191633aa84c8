"""The one table that maps backend client errors to crawlhub's errors.

Redis, asyncpg and sqlite3 each raise their own exception types when a server is down,
refuses a login or a file cannot be opened. Callers wrap backend calls in
:func:`backend_errors` (or test with :func:`is_unavailable`) so all of them surface as
:class:`BackendUnavailable`, which the API answers with 503 and ``Retry-After``.
"""

from __future__ import annotations

import importlib
import sqlite3
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from crawlhub.backends.backend import SCHEMES
from crawlhub.core.errors import BackendUnavailable, CrawlhubError

RETRY_AFTER = 1.0

# sqlite3.OperationalError messages that mean "the file is out of reach", not "bad SQL".
_SQLITE_UNAVAILABLE = ("unable to open database file", "disk i/o error", "database is locked",
                       "readonly database", "database or disk is full")


#: The client libraries whose errors can mean "out of reach": the module and the names
#: of its error types. A library's types are looked at only once it is imported - an
#: error of a library nobody imported cannot be raised - so the SQLite default never pays
#: for importing redis and asyncpg (~0.1 s of ``crawlhub serve``'s start-up).
_CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "redis": ("redis.exceptions", ("ConnectionError", "TimeoutError", "AuthenticationError",
                                   "BusyLoadingError")),
    "asyncpg": ("asyncpg.exceptions", ("PostgresConnectionError", "CannotConnectNowError",
                                       "InvalidPasswordError",
                                       "InvalidAuthorizationSpecificationError",
                                       "InterfaceError")),
}
#: A backend kind (``backends.backend.SCHEMES``) -> the client library behind it.
_CLIENT_OF_KIND = {"redis": "redis", "postgres": "asyncpg"}


_TYPES: dict[str, tuple[type[BaseException], ...]] = {}


def _types(clients: Iterable[str]) -> tuple[type[BaseException], ...]:
    """Python's own outage errors and those of ``clients`` (each library's looked up
    once; none for a library that is not installed)."""
    types: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
    for client in clients:
        if client not in _TYPES:
            module_name, names = _CLIENTS[client]
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # pragma: no cover - the extra is not installed
                _TYPES[client] = ()
            else:
                _TYPES[client] = tuple(getattr(module, name) for name in names)
        types += _TYPES[client]
    return types


def _loaded() -> list[str]:
    """The client libraries imported by now."""
    return [c for c in _CLIENTS if c in sys.modules]


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the backend is out of reach (retrying later may work)."""
    if isinstance(exc, BackendUnavailable):
        return True
    if isinstance(exc, CrawlhubError):
        cause = exc.__cause__
        return cause is not None and cause is not exc and is_unavailable(cause)
    if isinstance(exc, _types(_loaded())):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(marker in text for marker in _SQLITE_UNAVAILABLE)
    return False


def clients_of(config: Any) -> set[str]:
    """The client libraries (``redis``, ``asyncpg``) the URLs anywhere in ``config`` (a
    pydantic model or plain data) need."""
    found: set[str] = set()
    stack = [config.model_dump() if hasattr(config, "model_dump") else config]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            scheme, sep, _ = value.partition("://")
            kind = SCHEMES.get(scheme.lower(), ("", ""))[0] if sep else ""
            if kind in _CLIENT_OF_KIND:
                found.add(_CLIENT_OF_KIND[kind])
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set):
            stack.extend(value)
    return found


def unavailable_types(clients: Iterable[str] | None = None) -> tuple[type[BaseException], ...]:
    """The raw client error types :func:`is_unavailable` may say yes to (besides
    crawlhub's own errors caused by one), e.g. to register exception handlers for: those
    of ``clients`` (:func:`clients_of` a config) and of every client imported by now;
    ``None``: of every client installed."""
    wanted = set(_CLIENTS) if clients is None else {*clients, *_loaded()}
    types = _types(c for c in _CLIENTS if c in wanted)
    return (*types, sqlite3.OperationalError)


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

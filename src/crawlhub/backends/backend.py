"""A backend: the one parser of backend URLs, and the object every ``open_*`` factory
opens its component's implementation through.

:meth:`Backend.parse` reads a ``storage``/sink URL once: which backend it names
(:data:`SCHEMES`), what the client library takes, and what it was for (``what``, the
config ``key``), so every refusal reads the same. :meth:`Backend.open` picks the
implementation a component names for that backend's kind, makes sure its client library
is installed (:meth:`Backend.require`) and builds it with the parsed backend::

    backend = Backend.parse(url, kinds=STORES, what="hub state", key="storage.state")
    state = backend.open(STORES, redis={"prefix": prefix})

where ``STORES`` maps each kind to ``"package.module:Class"`` (imported only when
chosen) or to the class itself; this package never imports a component.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from crawlhub.core.errors import ConfigError
from crawlhub.core.extras import require
from crawlhub.core.redact import redact_url

Kind = Literal["sqlite", "redis", "postgres", "kafka"]

#: scheme -> (kind, scheme the client library takes)
SCHEMES: dict[str, tuple[Kind, str]] = {
    "sqlite": ("sqlite", "sqlite"),
    "sqlite+aiosqlite": ("sqlite", "sqlite"),
    "redis": ("redis", "redis"),
    "rediss": ("redis", "rediss"),
    "valkey": ("redis", "redis"),
    "valkeys": ("redis", "rediss"),
    "unix": ("redis", "unix"),
    "postgresql": ("postgres", "postgresql"),
    "postgres": ("postgres", "postgresql"),
    "postgresql+asyncpg": ("postgres", "postgresql"),
    "postgresql+psycopg": ("postgres", "postgresql"),
    "postgres+asyncpg": ("postgres", "postgresql"),
    "kafka": ("kafka", "kafka"),
}

#: What each kind looks like, for error messages.
EXAMPLES: dict[Kind, str] = {
    "sqlite": "sqlite:///relative/file.db or sqlite:////absolute/file.db",
    "redis": "redis://host:6379/0",
    "postgres": "postgresql://user@host:5432/db",
    "kafka": "kafka://host:9092",
}

#: The client library of each kind, and the extra that installs it (None: the stdlib's).
CLIENTS: dict[Kind, tuple[str, str | None]] = {
    "sqlite": ("sqlite3", None),
    "redis": ("redis", "redis"),
    "postgres": ("asyncpg", "postgres"),
    "kafka": ("aiokafka", "kafka"),
}

MEMORY = ":memory:"

#: What :meth:`Backend.open` takes for each kind: ``"package.module:Name"`` or the callable.
Implementations = Mapping[str, "str | Callable[..., Any]"]


class BackendURLError(ConfigError):
    """A backend URL names no backend crawlhub knows, or is malformed."""


@dataclass(frozen=True, slots=True)
class Backend:
    """A parsed backend URL, and what it was for.

    ``dsn`` is what the client library takes: ``redis://``/``rediss://``/``unix://`` for
    Redis (``valkey`` schemes mapped), ``postgresql://`` for asyncpg, ``host:port,...``
    for Kafka; for SQLite ``path`` is the file (``:memory:`` for an in-memory database).
    ``what`` names the component in messages (``"hub state"``), ``key`` the config key the
    URL came from. ``str(backend)`` is the URL as given; its repr masks the password.
    """

    url: str
    kind: Kind
    scheme: str
    dsn: str
    path: str = ""
    what: str = "backend"
    key: str | None = None

    @classmethod
    def parse(
        cls,
        url: str | Backend,
        *,
        kinds: Iterable[str] | None = None,
        what: str = "backend",
        key: str | None = None,
    ) -> Backend:
        """``url`` parsed; ``kinds`` limits the backends the caller can open (kinds, or
        the keys of :meth:`open`'s table of implementations). A
        :class:`Backend` is returned as it is (parsed once), if its kind is one of
        ``kinds``.

        Raises :class:`BackendURLError` naming the (redacted) URL, ``what`` it was for, the
        accepted schemes and an example of each; ``key`` is the config key it came from.
        """
        allowed = _kinds(kinds)
        if isinstance(url, Backend):
            if url.kind in allowed:
                return url
            url = url.url
        return _parse(url, allowed, what, key)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Backend({self.redacted!r}, kind={self.kind!r}, what={self.what!r})"

    @property
    def redacted(self) -> str:
        """The URL as given, its password masked: safe for messages and logs."""
        return redact_url(self.url)

    def require(self, needed_by: str | None = None) -> ModuleType:
        """The client library of this backend, or a
        :class:`~crawlhub.core.errors.MissingExtraError` naming the extra to install;
        ``needed_by`` (default: ``what``) says who needs it."""
        module, extra = CLIENTS[self.kind]
        if extra is None:
            return importlib.import_module(module)
        return require(module, extra, needed_by=needed_by or self.what)

    def load(self, impls: Implementations, *, needed_by: str | None = None
             ) -> Callable[..., Any]:
        """The implementation ``impls`` names for this backend's kind, its client library
        checked first (:meth:`require`); a kind ``impls`` lacks is refused like a URL
        naming no backend the component can open."""
        target = impls.get(self.kind)
        if target is None:
            raise _refused(self.url, _kinds(impls), self.what, self.key)
        self.require(needed_by)
        if not isinstance(target, str):
            return target
        module, _, name = target.partition(":")
        found: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return found

    def open(self, impls: Implementations, /, *args: Any, needed_by: str | None = None,
             sqlite: Mapping[str, Any] | None = None, redis: Mapping[str, Any] | None = None,
             postgres: Mapping[str, Any] | None = None, kafka: Mapping[str, Any] | None = None,
             **kwargs: Any) -> Any:
        """``impl(self, *args, **kwargs)``, ``impl`` the :meth:`load`-ed implementation for
        this backend's kind; the keyword arguments named after the kind (``redis={"prefix":
        ...}``) go to that kind's implementation only."""
        impl = self.load(impls, needed_by=needed_by)
        only = {"sqlite": sqlite, "redis": redis, "postgres": postgres, "kafka": kafka}[self.kind]
        return impl(self, *args, **kwargs, **(only or {}))


def _kinds(kinds: Iterable[str] | None) -> tuple[Kind, ...]:
    """The kinds named in ``kinds`` (every kind when None), in the caller's order."""
    if kinds is None:
        return tuple(EXAMPLES)
    return tuple(cast(Kind, k) for k in kinds if k in EXAMPLES)


def accepted_schemes(kinds: Iterable[Kind] | None = None) -> list[str]:
    wanted = set(kinds) if kinds is not None else None
    return [f"{s}://" for s, (k, _) in SCHEMES.items() if wanted is None or k in wanted]


def _refused(url: str, allowed: Iterable[Kind], what: str, key: str | None
             ) -> BackendURLError:
    """``url`` names no backend of the kinds ``allowed``."""
    allowed = tuple(allowed)
    examples = " or ".join(EXAMPLES[k] for k in allowed)
    return BackendURLError(
        f"{what} URL {redact_url(url)!r} has no scheme crawlhub can open; accepted: "
        f"{', '.join(accepted_schemes(allowed))} (e.g. {examples})",
        key=key,
    )


def _parse(url: str, allowed: tuple[Kind, ...], what: str, key: str | None) -> Backend:
    text = str(url).strip()
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    found = SCHEMES.get(scheme)
    if found is None or found[0] not in allowed:
        raise _refused(text, allowed, what, key)
    kind, client_scheme = found
    rest = text.split("://", 1)[1]

    def bad(reason: str) -> BackendURLError:
        return BackendURLError(
            f"{what} URL {redact_url(text)!r} is malformed ({reason}): use {EXAMPLES[kind]}",
            key=key,
        )

    if kind == "sqlite":
        return Backend(text, kind, scheme, dsn=text, path=_sqlite_path(rest, bad), what=what,
                       key=key)
    if kind == "kafka":
        servers = rest.split("/", 1)[0].split("?", 1)[0]
        if not servers or any(not s.strip() for s in servers.split(",")):
            raise bad("no host:port")
        return Backend(text, kind, scheme, dsn=servers, what=what, key=key)
    # The reasons below never quote a part of the URL: with a raw '/' in the password,
    # urlsplit takes the password's tail for the path (and its head for the port).
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    cut_password = bad("its password holds '/', '?' or '#'; percent-encode them as %2F, %3F,"
                       " %23")
    if "@" in rest and "@" not in authority and ":" in authority and \
            not authority.rsplit(":", 1)[1].isdigit():
        raise cut_password
    try:
        parts = urlsplit(f"{client_scheme}://{rest}")
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:  # its text quotes the port, maybe a piece of the password
        raise bad("port out of range 0-65535" if "range" in str(exc) else
                  "the port is not a number, or the host is malformed") from None
    if kind == "redis":
        if client_scheme == "unix" and not parts.path:
            raise bad("no socket path")
        if client_scheme != "unix" and not parts.hostname:
            raise bad("no host")
        db = parts.path.strip("/")
        if client_scheme != "unix" and db and not db.isdigit():
            raise cut_password if "@" in db else bad(f"database {db!r} is not a number")
    return Backend(text, kind, scheme, dsn=f"{client_scheme}://{rest}", what=what, key=key)


def _sqlite_path(rest: str, bad: Callable[[str], BackendURLError]) -> str:
    """``/rel/file.db`` -> ``rel/file.db``; ``//abs/file.db`` -> ``/abs/file.db``."""
    rest = rest.split("?", 1)[0]
    if rest in ("", "/:memory:", ":memory:"):
        return MEMORY
    if not rest.startswith("/"):
        raise bad("a host is not allowed; three slashes start the path")
    path = rest[1:]
    if not path:
        raise bad("no file path")
    return path


def sqlite_file(url_or_path: str | Backend) -> str:
    """The file of a ``sqlite:///`` URL, or ``url_or_path`` itself when it is a plain path."""
    if not isinstance(url_or_path, Backend) and "://" not in str(url_or_path):
        return str(url_or_path)
    return Backend.parse(url_or_path, kinds=("sqlite",), what="SQLite").path

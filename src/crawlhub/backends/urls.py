"""The one parser of backend URLs: which backend a ``storage``/sink URL names, and how.

Every ``open_*`` factory asks :func:`parse_backend_url` instead of testing prefixes, so
all of them accept the same schemes and refuse the rest with the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from crawlhub.core.errors import ConfigError
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

MEMORY = ":memory:"


class BackendURLError(ConfigError):
    """A backend URL names no backend crawlhub knows, or is malformed."""


@dataclass(frozen=True, slots=True)
class BackendURL:
    """A parsed backend URL.

    ``dsn`` is what the client library takes: ``redis://``/``rediss://``/``unix://`` for
    Redis (``valkey`` schemes mapped), ``postgresql://`` for asyncpg, ``host:port,...``
    for Kafka; for SQLite ``path`` is the file (``:memory:`` for an in-memory database).
    """

    url: str
    kind: Kind
    scheme: str
    dsn: str
    path: str = ""

    @property
    def redacted(self) -> str:
        """The URL as given, its password masked: safe for messages and logs."""
        return redact_url(self.url)


def accepted_schemes(kinds: Iterable[Kind] | None = None) -> list[str]:
    wanted = set(kinds) if kinds is not None else None
    return [f"{s}://" for s, (k, _) in SCHEMES.items() if wanted is None or k in wanted]


def parse_backend_url(
    url: str,
    *,
    kinds: Iterable[Kind] | None = None,
    what: str = "backend",
    key: str | None = None,
) -> BackendURL:
    """Parse ``url``; ``kinds`` limits the backends the caller can open.

    Raises :class:`BackendURLError` naming the (redacted) URL, ``what`` it was for, the
    accepted schemes and an example of each; ``key`` is the config key it came from.
    """
    allowed: tuple[Kind, ...] = tuple(kinds) if kinds is not None else tuple(EXAMPLES)
    text = str(url).strip()
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    found = SCHEMES.get(scheme)
    if found is None or found[0] not in allowed:
        examples = " or ".join(EXAMPLES[k] for k in allowed)
        raise BackendURLError(
            f"{what} URL {redact_url(text)!r} has no scheme crawlhub can open; accepted: "
            f"{', '.join(accepted_schemes(allowed))} (e.g. {examples})",
            key=key,
        )
    kind, client_scheme = found
    rest = text.split("://", 1)[1]

    def bad(reason: str) -> BackendURLError:
        return BackendURLError(
            f"{what} URL {redact_url(text)!r} is malformed ({reason}): use {EXAMPLES[kind]}",
            key=key,
        )

    if kind == "sqlite":
        return BackendURL(text, kind, scheme, dsn=text, path=_sqlite_path(rest, bad))
    if kind == "kafka":
        servers = rest.split("/", 1)[0].split("?", 1)[0]
        if not servers or any(not s.strip() for s in servers.split(",")):
            raise bad("no host:port")
        return BackendURL(text, kind, scheme, dsn=servers)
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
    return BackendURL(text, kind, scheme, dsn=f"{client_scheme}://{rest}")


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


def sqlite_file(url_or_path: str) -> str:
    """The file of a ``sqlite:///`` URL, or ``url_or_path`` itself when it is a plain path."""
    if "://" not in str(url_or_path):
        return str(url_or_path)
    parsed = parse_backend_url(str(url_or_path), kinds=("sqlite",), what="SQLite")
    return parsed.path

"""The one place that masks secrets before a config, a URL or a log line is shown.

URL passwords, secret query parameters (``?password=``, ``&token=``, ``&sign=``...) and the
values of credential-like keys and headers become ``***``; the names are configurable.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote_plus

from pydantic import BaseModel, SecretBytes, SecretStr

MASK = "***"

#: Names (glob patterns, case-insensitive) whose values are secrets: mapping keys, query
#: parameters and headers. ``logging.secret_names`` adds to them.
DEFAULT_SECRET_NAMES: tuple[str, ...] = (
    "*password*", "*passwd*", "pass", "pwd", "*secret*", "*token*", "*sign*", "*key*",
    "*credential*", "auth", "*authorization*", "*cookie*", "*session*",
)
#: Names that match a pattern above but hold no secret. ``logging.public_names`` adds to them.
DEFAULT_PUBLIC_NAMES: tuple[str, ...] = (
    "token_scope", "token_per_second", "keyword", "keywords", "session_idle",
)
#: Config options named ``key`` hold a queue, stream or record key, not an API key; in a
#: URL (``?key=...``) or a header the same name is a secret.
CONFIG_PUBLIC_KEYS: frozenset[str] = frozenset({"key", "keys"})


class SecretNames:
    """Which names hold secrets: glob patterns, minus public names (case-insensitive)."""

    def __init__(self, secret: Iterable[str] = (), public: Iterable[str] = ()) -> None:
        self.secret = (*DEFAULT_SECRET_NAMES, *(p for p in secret if p))
        self.public = frozenset(n.lower() for n in (*DEFAULT_PUBLIC_NAMES, *public))
        self._match = re.compile(
            "|".join(fnmatch.translate(p.lower()) for p in self.secret)
        ).match

    def __call__(self, name: object, *, config_key: bool = False) -> bool:
        """Whether ``name`` (a key, parameter or header name) holds a secret.

        ``config_key``: ``name`` is a key of a config mapping (``key`` is then public).
        """
        if not isinstance(name, str):
            return False
        low = name.lower()
        if low in self.public or (config_key and low in CONFIG_PUBLIC_KEYS):
            return False
        return self._match(low) is not None


_names = SecretNames()


def configure_secrets(secret: Iterable[str] = (), public: Iterable[str] = ()) -> None:
    """Add names to the process-wide lists (from the config's ``logging`` section)."""
    global _names
    _names = SecretNames(secret, public)


def secret_names() -> SecretNames:
    """The process-wide :class:`SecretNames` (defaults plus :func:`configure_secrets`)."""
    return _names


def is_secret_key(key: object, names: SecretNames | None = None) -> bool:
    """Whether a config mapping key names a secret (``password``, ``api_key``, ``sign``...)."""
    return (names or _names)(key, config_key=True)


# scheme://user:password@host -> scheme://user:***@host (user may be empty: redis://:pw@h).
# The password runs to the last '@' of the URL: one written raw may hold '@', '/', '?' or
# '#' (redis://:p@ss/w0rd@h); a URL with an '@' in its query loses more to the mask than
# its password, which is the safe side.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"<>]*):(?P<pw>[^\s'\"<>]+)@"
)
# ?name=value, &name=value, ;name=value (also after a percent-encoded ? or &: a URL in a path)
_QUERY_PARAM = re.compile(
    r"(?P<head>(?:[?&;]|%3[Ff]|%26)(?P<name>[^=&#;?\s'\"<>]+)=)"
    r"(?P<value>(?:(?!%26)[^&#;\s'\"<>])*)"
)
# 'name': 'value' / "name": "value" (dict reprs and JSON inside a message)
_QUOTED_PAIR = re.compile(
    r"(?P<head>(?P<q>['\"])(?P<name>[^'\"\n]{1,100})(?P=q)\s*:\s*(?P<vq>['\"]))"
    r"(?P<value>(?:\\.|(?!(?P=vq)).)*)(?P=vq)"
)
# Authorization: Bearer ... (one header per line)
_HEADER_LINE = re.compile(r"(?im)^(?P<head>[ \t]*(?P<name>[A-Za-z0-9-]{1,60})[ \t]*:[ \t]*)(?P<value>\S.*)$")
# KeyError: 'x' is a traceback line, not a header named like a key
_EXCEPTION_NAME = re.compile(r"[A-Z][A-Za-z0-9]*(Error|Exception|Warning|Exit|Interrupt)$")


def redact_url(text: str, names: SecretNames | None = None) -> str:
    """``text`` with URL passwords and the values of secret query parameters masked.

    ``redis://:pw@h/0`` -> ``redis://:***@h/0``; ``https://h/p?sign=ab&page=2`` ->
    ``https://h/p?sign=***&page=2``. Works on a URL or on any text holding URLs.
    """
    check = names or _names
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    if "=" not in text:
        return text

    def query(m: re.Match[str]) -> str:
        if m.group("value") and check(unquote_plus(m.group("name"))):
            return m.group("head") + MASK
        return m.group(0)

    return _QUERY_PARAM.sub(query, text)


def redact_text(text: str, names: SecretNames | None = None) -> str:
    """A log line or message with its secrets masked: URLs (:func:`redact_url`),
    ``'password': '...'`` pairs and ``Authorization: ...`` header lines."""
    check = names or _names
    text = redact_url(text, check)

    def pair(m: re.Match[str]) -> str:
        if m.group("value") and check(m.group("name")):
            return f"{m.group('head')}{MASK}{m.group('vq')}"
        return m.group(0)

    if ":" in text:
        text = _QUOTED_PAIR.sub(pair, text)
        if "\n" in text or text.count(":") == 1:
            text = _HEADER_LINE.sub(
                lambda m: m.group("head") + MASK
                if check(m.group("name")) and not _EXCEPTION_NAME.match(m.group("name"))
                else m.group(0),
                text,
            )
    return text


def redact(obj: Any, names: SecretNames | None = None) -> Any:
    """A deep copy of ``obj`` (a config, an entry, headers...) with secrets masked.

    Values under secret keys become ``"***"`` (``None`` and ``""`` stay: nothing to hide),
    strings lose URL passwords and secret query values, SecretStr values become ``"***"``.
    Pydantic models are dumped to plain JSON-able data first.
    """
    check = names or _names
    if isinstance(obj, BaseModel):
        return redact(obj.model_dump(mode="json", by_alias=True), check)
    if isinstance(obj, SecretStr | SecretBytes):
        return MASK
    if isinstance(obj, Mapping):
        return {
            key: (
                MASK
                if value is not None and value != "" and check(key, config_key=True)
                else redact(value, check)
            )
            for key, value in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [redact(item, check) for item in obj]
    if isinstance(obj, str):
        return redact_url(obj, check)
    return obj


_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message"}


class SecretFilter(logging.Filter):
    """A logging filter that masks secrets in every record (install it on handlers): the
    message, string ``extra`` fields, and the traceback text of an exception."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string is logging's to report
            return True
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        for name, value in list(vars(record).items()):
            if name not in _RECORD_FIELDS and not name.startswith("_"):
                if isinstance(value, str):
                    setattr(record, name, redact_text(value))
                elif isinstance(value, Mapping | list | tuple):
                    setattr(record, name, redact(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(_FORMATTER.formatException(record.exc_info))
        return True


_FORMATTER = logging.Formatter()

"""The result-code table: what a download's outcome reports to the hub as its result code.

The hub's retry / failback / dont_retry rules match these codes, so they are configurable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from crawlhub.core.errors import ConfigError

# Outcome names: what a download ended in, in the user's words. ``Fetched.outcome`` is one.
SUCCESS = "success"
HTTP_ERROR = "http_error"
TIMEOUT = "timeout"
CONNECTION_ERROR = "connection_error"
BANNED = "banned"
TOO_LARGE = "too_large"
PARSE_ERROR = "parse_error"
TOO_MANY_REDIRECTS = "too_many_redirects"
ROBOTS_DISALLOWED = "robots_disallowed"
INVALID_URL = "invalid_url"

OUTCOMES = (
    SUCCESS,
    HTTP_ERROR,
    TIMEOUT,
    CONNECTION_ERROR,
    BANNED,
    TOO_LARGE,
    PARSE_ERROR,
    TOO_MANY_REDIRECTS,
    ROBOTS_DISALLOWED,
    INVALID_URL,
)


class ResultCodes(BaseModel):
    """Outcome -> result code. Defaults (config key ``result_codes``)::

        success             1000   the hub's default terminal code
        http_error          the HTTP status itself (404, 429, 500...) unless ``http_error``
                            is set; ``statuses`` maps single statuses, e.g. ``{404: 1000}``
        timeout             2001
        connection_error    2002
        banned              2003
        too_large           2004
        parse_error         2005
        too_many_redirects  2006
        robots_disallowed   2007
        invalid_url         2008   not an http(s) URL one can request: retrying cannot help
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    success: int = 1000
    http_error: int | None = None
    timeout: int = 2001
    connection_error: int = 2002
    banned: int = 2003
    too_large: int = 2004
    parse_error: int = 2005
    too_many_redirects: int = 2006
    robots_disallowed: int = 2007
    invalid_url: int = 2008
    statuses: dict[int, int] = {}

    @field_validator("statuses")
    @classmethod
    def _real_statuses(cls, value: dict[int, int]) -> dict[int, int]:
        for status in value:
            if not 100 <= status <= 599:
                raise ValueError(f"{status} is not an HTTP status (100..599)")
        return value

    def code(self, outcome: str, status: int = 0) -> int:
        """The result code of ``outcome`` (one of ``OUTCOMES``); ``status`` is the HTTP
        status of the final response, used for ``http_error`` and the ``statuses`` map.

        A ``statuses`` entry wins over the outcome's code when the response has that status
        (so ``{404: 1000}`` makes a 404 a success, ``{200: 2003}`` is allowed too).
        """
        if status and self.statuses:
            mapped = self.statuses.get(status)
            if mapped is not None:
                return mapped
        if outcome == HTTP_ERROR:
            return self.http_error if self.http_error is not None else status
        try:
            return int(getattr(self, outcome))
        except AttributeError:
            raise ValueError(f"unknown outcome {outcome!r}; one of {', '.join(OUTCOMES)}") from None

    @classmethod
    def from_config(
        cls, data: Mapping[str, Any] | None, *, file: str | None = None, key: str = "result_codes"
    ) -> ResultCodes:
        """Validate a ``result_codes`` mapping; a bad entry is a ``ConfigError`` naming its key."""
        try:
            return cls.model_validate(dict(data or {}))
        except ValidationError as exc:
            raise config_error(exc, file=file, prefix=key) from None


def config_error(exc: ValidationError, *, file: str | None = None, prefix: str = "") -> ConfigError:
    """The first pydantic error as a ``ConfigError`` whose key is the dotted path to it."""
    err = exc.errors()[0]
    parts = [prefix] if prefix else []
    parts += [str(p) for p in err["loc"]]
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    got = f" (got {err['input']!r:.80})" if err["type"] not in ("missing", "value_error") else ""
    return ConfigError(f"{msg}{got}", file=file, key=".".join(parts) or None)


__all__ = [
    "BANNED",
    "CONNECTION_ERROR",
    "HTTP_ERROR",
    "INVALID_URL",
    "OUTCOMES",
    "PARSE_ERROR",
    "ROBOTS_DISALLOWED",
    "SUCCESS",
    "TIMEOUT",
    "TOO_LARGE",
    "TOO_MANY_REDIRECTS",
    "ResultCodes",
    "config_error",
]

"""When a response is an error, whether to try again, and how long to back off first.

HTTP errors, timeouts and API error codes in the JSON body (``{"code": 500}``) are errors;
retryable ones are tried again with exponential backoff plus jitter, up to ``tries``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crawlhub.core.errors import FetchError
from crawlhub.fetch.http import Response

#: Statuses worth another try by default (besides every 5xx).
RETRY_STATUSES: frozenset[int] = frozenset({408, 425, 429})


class TooManyFailures(FetchError):
    """More than ``max_consecutive_failures`` requests in a row failed: the run ends FAILED."""

    def __init__(self, message: str, *, consecutive: int) -> None:
        self.consecutive = consecutive
        super().__init__(message)


@dataclass(slots=True)
class Verdict:
    """Why a response is an error, and whether another try may help."""

    error: str
    retryable: bool


@dataclass
class RetryPolicy:
    """``tries`` attempts in all (3 = the first plus two retries), backoff between them.

    - the n-th retry waits ``min(backoff_max, backoff_base * backoff_factor**(n-1))`` plus
      a uniform jitter of up to ``jitter`` times that;
    - an HTTP status >= 400 is an error; it is retried when it is 5xx or in
      ``retry_statuses`` (default 408, 425, 429), other 4xx fail at once;
    - ``error_field`` (a dotted path such as ``"code"`` or ``"meta.code"``) turns a JSON
      body whose value there is not in ``ok_values`` into a retryable API error, with the
      body's ``message_field`` in the error text; a body that is not JSON is one too;
    - ``is_error(response)`` may return an error text for anything else (retryable).
    """

    tries: int = 3
    backoff_base: float = 1.0
    backoff_factor: float = 2.0
    backoff_max: float = 30.0
    jitter: float = 0.5
    retry_statuses: frozenset[int] = field(default_factory=lambda: RETRY_STATUSES)
    error_field: str | None = None
    ok_values: tuple[Any, ...] = (0, 200, "0", "200")
    message_field: str | None = "msg"
    is_error: Callable[[Response], str | None] | None = None

    def __post_init__(self) -> None:
        if self.tries < 1:
            raise ValueError(f"retry.tries must be >= 1 (attempts in all), got {self.tries!r}")
        for key in ("backoff_base", "backoff_max", "jitter"):
            value = getattr(self, key)
            if value < 0:
                raise ValueError(f"retry.{key} must be >= 0, got {value!r}")
        if self.backoff_factor < 1:
            raise ValueError(f"retry.backoff_factor must be >= 1, got {self.backoff_factor!r}")

    @classmethod
    def api_codes(cls, field_name: str = "code", ok: tuple[Any, ...] = (0, 200),
                  **options: Any) -> RetryPolicy:
        """A policy that also reads API error codes from the JSON body's ``field_name``."""
        ok_values = tuple(ok) + tuple(str(v) for v in ok)
        return cls(error_field=field_name, ok_values=ok_values, **options)

    def judge(self, response: Response) -> Verdict | None:
        """None when ``response`` is a success, else why it failed."""
        if response.status >= 400:
            retryable = response.status >= 500 or response.status in self.retry_statuses
            return Verdict(f"HTTP {response.status}{_body_hint(response)}", retryable)
        if self.error_field is not None:
            try:
                body = response.json()
            except ValueError:
                return Verdict(f"body is not JSON (expected '{self.error_field}')", True)
            value = _dig(body, self.error_field)
            if value not in self.ok_values:
                msg = _dig(body, self.message_field) if self.message_field else None
                text = f"API error {self.error_field}={value!r}"
                return Verdict(f"{text}: {msg}" if msg else text, True)
        if self.is_error is not None:
            error = self.is_error(response)
            if error:
                return Verdict(error, True)
        return None

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 = the first retry)."""
        delay = min(self.backoff_max, self.backoff_base * self.backoff_factor ** (retry - 1))
        return delay + (rng or random).uniform(0.0, self.jitter * delay)


def _dig(body: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(body, dict):
            return None
        body = body.get(part)
    return body


def _body_hint(response: Response) -> str:
    text = response.text()[:120].strip()
    return f" ({text})" if text else ""

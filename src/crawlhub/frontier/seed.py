"""The Seed record: one request the frontier admits once per segment and dispatches.

Seeds travel as compact JSON between the frontier and its store; the store adds nothing.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from crawlhub.core import jsoncodec
from crawlhub.core.errors import FrontierError

#: How a dispatched seed ended: archived as done or failed, or returned to pending.
Outcome = Literal["ok", "failed", "retry"]
OUTCOMES: tuple[str, ...] = ("ok", "failed", "retry")

#: Priorities are clamped to this range so both stores order them exactly.
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1


@dataclass(slots=True)
class Seed:
    """A request to make: the URL plus what the fetcher needs, and when it may run.

    ``key``, ``segment``, ``attempts``, ``lease_until`` and ``rank`` are set by the
    frontier: the dedup key, the time segment it was admitted in (together they name the
    seed in the store), how often it was leased, when its current lease ends, and its
    place in the store's order.
    """

    url: str
    method: str = "GET"
    body: str | bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    #: Unix time before which the seed is not dispatched (None: at once).
    not_before: float | None = None
    key: str | None = None
    segment: int | None = None
    attempts: int = 0
    lease_until: float | None = None
    #: Set by a claim: the seed's place among seeds of its priority in the store's order
    #: (smaller first), so a caller merging claims keeps that order.
    rank: int | None = None

    def __post_init__(self) -> None:
        url = self.url
        if not isinstance(url, str) or not url or url.isspace():
            raise FrontierError(f"seed url {url!r} is empty or not a string: give an URL")
        # (checks first: a plain GET seed at priority 0 is built once per admitted URL)
        if self.method != "GET":
            self.method = (self.method or "GET").upper()
        priority = self.priority
        if type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            self.priority = max(PRIORITY_MIN, min(PRIORITY_MAX, int(priority or 0)))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, url_field: str = "url") -> Seed:
        """A seed from a JSON object: ``url`` (or ``url_field``) plus the optional fields."""
        url = data.get(url_field)
        if not isinstance(url, str) or not url.strip():
            raise FrontierError(
                f"seed {dict(data)!r} has no {url_field!r} string: add the URL under "
                f"{url_field!r}"
            )
        body = data.get("body")
        if body is None and data.get("body_b64") is not None:
            body = base64.b64decode(data["body_b64"])
        not_before = data.get("not_before")
        return cls(
            url=url.strip(),
            method=str(data.get("method") or "GET"),
            body=body,
            headers=dict(data.get("headers") or {}),
            meta=dict(data.get("meta") or {}),
            priority=int(data.get("priority") or 0),
            not_before=None if not_before is None else float(not_before),
        )

    def to_dict(self) -> dict[str, Any]:
        """The user's fields as JSON-ready data (what the store keeps and the API shows)."""
        out: dict[str, Any] = {"url": self.url}
        if self.method != "GET":
            out["method"] = self.method
        if isinstance(self.body, bytes):
            out["body_b64"] = base64.b64encode(self.body).decode()
        elif self.body is not None:
            out["body"] = self.body
        if self.headers:
            out["headers"] = self.headers
        if self.meta:
            out["meta"] = self.meta
        if self.priority:
            out["priority"] = self.priority
        if self.not_before is not None:
            out["not_before"] = self.not_before
        return out

    def encode(self) -> str:
        """Compact storage form: the bare URL for a plain GET seed, else JSON."""
        if (
            self.method == "GET"
            and self.body is None
            and not self.headers
            and not self.meta
            and not self.priority
            and self.not_before is None
            and not self.url.startswith("{")
        ):
            return self.url
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def decode(cls, data: str | bytes, **frontier_fields: Any) -> Seed:
        """The seed ``encode`` stored, with ``frontier_fields`` (key, segment, ...) set."""
        text = data.decode() if isinstance(data, bytes) else data
        # (orjson, with the standard library's reading where it differs: the same values)
        seed = cls.from_mapping(jsoncodec.loads(text)) if text.startswith("{") else cls(text)
        for name, value in frontier_fields.items():
            setattr(seed, name, value)
        return seed

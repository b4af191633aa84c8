"""Conditional recrawl: what the frontier's archive keeps of each URL's last answer
(``ETag``, ``Last-Modified``, a hash of the body) so a recrawl in a later segment asks
``If-None-Match`` / ``If-Modified-Since`` and tells a changed page from an unchanged one.

A server's header is hostile input: an ``ETag`` is kept only if it is printable ASCII of
at most :data:`MAX_ETAG` characters (so it can never break the request it goes back in),
a ``Last-Modified`` only if it reads as an HTTP date (and is sent back re-formatted).
"""

from __future__ import annotations

import email.utils
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC

#: The longest ETag kept (RFC 9110 sets none; real ones are under 100 characters).
MAX_ETAG = 256


@dataclass(frozen=True, slots=True)
class Validators:
    """One URL's last answer: ``etag`` and ``last_modified`` (as sent back), ``hash``
    (hex digest of its body; None: not fetched whole) and ``seen`` (epoch seconds)."""

    etag: str | None = None
    last_modified: str | None = None
    hash: str | None = None
    seen: float = 0.0

    def headers(self) -> dict[str, str]:
        """The conditional request headers these validators allow (maybe none)."""
        out: dict[str, str] = {}
        if self.etag:
            out["If-None-Match"] = self.etag
        if self.last_modified:
            out["If-Modified-Since"] = self.last_modified
        return out

    def encode(self) -> str:
        return json.dumps([self.etag, self.last_modified, self.hash, self.seen],
                          separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Validators:
        etag, modified, digest, seen = json.loads(text)
        return cls(etag, modified, digest, float(seen))


def clean_etag(value: str | None) -> str | None:
    """``value`` if it is safe to send back (printable ASCII, short), else None."""
    if not value or len(value) > 2 * MAX_ETAG or not all(" " <= c <= "~" for c in value):
        return None  # a control character anywhere: not an ETag, maybe an injection
    text = value.strip()
    return text if text and len(text) <= MAX_ETAG else None


def clean_http_date(value: str | None) -> str | None:
    """``value`` re-formatted as an IMF-fixdate if it reads as an HTTP date, else None."""
    if not value or len(value) > 64:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    try:
        return email.utils.format_datetime(when.astimezone(UTC), usegmt=True)
    except (ValueError, OverflowError):  # out of datetime's range once in UTC
        return None


def content_hash(body: bytes) -> str:
    """The hash that tells a changed page from an unchanged one (BLAKE2b, 128 bits)."""
    return hashlib.blake2b(body, digest_size=16).hexdigest()


def validators_of(headers: Mapping[str, str], body: bytes | None, now: float) -> Validators:
    """What to keep of an answer: its cleaned validators and its body's hash."""
    return Validators(clean_etag(headers.get("ETag")),
                      clean_http_date(headers.get("Last-Modified")),
                      None if body is None else content_hash(body), now)

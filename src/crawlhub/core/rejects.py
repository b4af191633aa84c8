"""Entries a reader cannot take - undecodable, of the wrong shape, unsigned or forged:
counted, logged once with their id, and kept aside in a dead stream for inspection.

Every stream, list and channel crawlhub reads calls :func:`rejected` for such an entry
and then acks (or drops) it, so one bad entry never stops a read loop. The counter is
``crawlhub_stream_entries_rejected_total{stream,reason}`` on ``GET /metrics``; the dead
streams are named in :mod:`crawlhub.core.keys` (``dead_stream``) and capped at
:data:`DEAD_MAXLEN` entries.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger("crawlhub.rejects")

#: Reasons (the counter's ``reason`` label).
MALFORMED = "malformed"  # not decodable, or not of the shape the reader needs
UNSIGNED = "unsigned"  # a key is configured and the entry carries no signature
BAD_SIGNATURE = "bad_signature"  # signed, but not with the configured key (or altered)
SKEW = "skew"  # its sender's stamp is too far from the reader's clock

#: Entries kept per dead stream (approximately: ``MAXLEN ~``).
DEAD_MAXLEN = 10_000
#: Bytes of a rejected entry's fields kept in its dead-stream copy.
KEEP_BYTES = 64 * 1024

#: The registry ``GET /metrics`` adds to the hub's (one per process, like the counts).
REGISTRY = CollectorRegistry()
REJECTED = Counter("crawlhub_stream_entries_rejected",
                   "Entries of a stream, list or channel that a reader rejected, acked and"
                   " kept aside (malformed, unsigned, bad_signature, skew)",
                   ["stream", "reason"], registry=REGISTRY)


def rejected(stream: str, entry_id: str, reason: str, detail: str, *,
             dead: str = "") -> None:
    """Count one rejected entry of ``stream`` (a stable label: the stream family, not a
    per-job name) and log it once with its id."""
    REJECTED.labels(stream, reason).inc()
    where = f"; kept in {dead}" if dead else ""
    log.warning("%s: rejected entry %s (%s: %s); skipped, the reader goes on%s", stream,
                entry_id, reason, detail[:300], where)


class Once:
    """Marks of stored bad entries already reported: a reader that meets the same one on
    every read (a table, a registry) counts and logs it once. Bounded: past ``limit``
    marks it forgets them all (and reports each again, once)."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._marks: set[Any] = set()

    def first(self, mark: Any) -> bool:
        """True the first time ``mark`` is seen (then it is remembered)."""
        if mark in self._marks:
            return False
        if len(self._marks) > self.limit:
            self._marks.clear()
        self._marks.add(mark)
        return True


def count(stream: str, reason: str) -> float:
    """How many entries of ``stream`` were rejected for ``reason`` in this process."""
    return REGISTRY.get_sample_value("crawlhub_stream_entries_rejected_total",
                                     {"stream": stream, "reason": reason}) or 0.0


def dead_fields(source: str, entry_id: str, reason: str, detail: str,
                fields: dict[Any, Any] | None) -> dict[str, Any]:
    """The dead-stream copy of an entry: where it came from, why, and its fields (each
    cut to :data:`KEEP_BYTES`)."""
    out: dict[str, Any] = {"stream": source, "id": entry_id, "reason": reason,
                           "detail": detail[:1000]}
    for name, value in (fields or {}).items():
        key = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        if key in out:
            key = f"field:{key}"
        if isinstance(value, str):
            value = value.encode("utf-8", "replace")
        elif not isinstance(value, bytes):
            value = str(value).encode()
        out[key] = value[:KEEP_BYTES]
    return out


def xadd_dead(pipe: Any, dead: str, fields: dict[str, Any]) -> None:
    """Queue the copy on a Redis pipeline (capped)."""
    pipe.xadd(dead, fields, maxlen=DEAD_MAXLEN, approximate=True)

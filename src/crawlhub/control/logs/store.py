"""The searchable log store protocol every backend implements (SQLite FTS5 embedded,
PostgreSQL full text distributed).

Callers: the transport (:mod:`crawlhub.control.logs.transport`) writes batches, in this
process (embedded) or in a collector moving them from the Redis stream (distributed);
:class:`~crawlhub.control.logs.service.LogService`, the ``/logs`` API, the SSE tail and
``crawlhub logs`` search; the pruner (``ControlPlane.start``) prunes.

Promises:

- ``id`` is given by the store, grows with every write and is never reused, and a reader
  never sees a line of id ``n`` before every line of a smaller id is visible (writes are
  serialised), so ``after=<last id seen>`` never skips a line: tails are exact;
- a line written with a ``uid`` is stored once, however often it is written (the
  collector's at-least-once delivery leaves no duplicates);
- searches see the same lines on every backend (the words indexed and the search text
  are made above the SQL, in :mod:`crawlhub.control.logs.text`);
- lines come newest first (highest id) unless ``after`` is given (then oldest first);
- a backend out of reach raises :class:`~crawlhub.core.errors.BackendUnavailable`; a query the
  store refuses raises :class:`~crawlhub.control.logs.text.LogQueryError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from crawlhub.control.logs.line import LogLine
from crawlhub.control.logs.text import LogQuery


@dataclass(slots=True)
class LogPage:
    """One page of a search: ``lines`` in the order asked, and ``next``, the ``before``
    (or, for a forward read, ``after``) that gives the next page; None on the last."""

    lines: list[LogLine]
    next: int | None


@runtime_checkable
class LogStore(Protocol):
    """One searchable log store; ``name`` is its redacted URL."""

    name: str

    async def open(self) -> None:
        """Create the tables and indexes when missing (idempotent, safe from two
        processes at once)."""
        ...

    async def write(self, lines: Sequence[LogLine], uids: Sequence[str | None] | None = None
                    ) -> int:
        """Store ``lines`` (already cleaned: :func:`~crawlhub.control.logs.text.
        clean_line`) in one transaction; ``uids[i]``, when given, makes line ``i``
        idempotent. Returns how many were new. ``line.id`` is ignored."""
        ...

    async def search(self, query: LogQuery) -> LogPage:
        """The lines matching ``query``, at most ``query.limit``; see the module
        docstring for the order."""
        ...

    async def last_id(self) -> int:
        """The highest id stored (0 when empty): where a tail of new lines starts."""
        ...

    async def count(self) -> int:
        """How many lines are stored."""
        ...

    async def prune(self, *, max_age: float | None = None, max_lines: int | None = None,
                    now: float | None = None) -> int:
        """Delete lines older than ``max_age`` seconds (by ``ts``) and, beyond that, the
        oldest lines over ``max_lines``; in batches, so writers wait at most one batch.
        Returns how many were deleted."""
        ...

    async def close(self) -> None:
        ...

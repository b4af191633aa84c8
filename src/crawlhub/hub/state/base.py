"""The hub state's protocol and what both backends share: the ledger entry, its text
form, the token bucket arithmetic and the lease lengths."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from crawlhub.core import jsoncodec
from crawlhub.hub.state.intake import Intake

#: A ledger entry with no result_timeout is forgotten after this long (seconds).
DEFAULT_RETENTION = 7 * 24 * 3600.0

COUNTER_FIELDS = ("total", "success", "failed", "retried", "rerouted", "failback", "timeout",
                  "orphan")
#: How long a claimed or settled-but-unfinished entry stays leased to one hub process
#: (seconds); a process that dies holding it hands it to the next sweep after this.
CLAIM_LEASE = 30.0
#: Seconds of per-second dispatch counts kept for the outbound rate.
RATE_KEEP = 60


@dataclass(slots=True)
class LedgerEntry:
    """A dispatched task waiting for its result.

    ``deadline`` (epoch seconds) is when it counts as lost (None: never, only retained).
    """

    task: dict[str, Any]
    outbound: str
    deadline: float | None
    #: What is still to be done for this entry while it is under a lease: ``push`` (it is
    #: the next dispatch of its task, not pushed yet), ``fail`` (its task failed; the
    #: failure line is not written yet) or ``timeout`` (its deadline passed). None: the
    #: entry waits for its result.
    pending: str | None = None
    #: For ``pending == "fail"``: ``{"task_result": ..., "reason": ...}`` to log.
    failure: dict[str, Any] | None = None
    #: The stored text this entry was read from; :meth:`HubState.settle` applies only
    #: while the stored entry is still exactly this.
    raw: str | bytes | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class Settle:
    """One step of :meth:`HubState.settle_many`: replace ``current`` (as read) by ``after``
    (None: remove it) and add ``counters``, if ``current`` is still what is stored."""

    current: LedgerEntry
    after: LedgerEntry | None
    counters: Sequence[tuple[str, str, int]] = ()
    #: for ``after.pending`` set: until when ``after`` stays leased to this process
    lease_until: float = 0.0


class HubState(Protocol):
    """Ledger, counters and token buckets shared by every hub process on one backend."""

    async def record(self, entries: Sequence[LedgerEntry],
                     counters: Sequence[tuple[str, str, int]] = ()) -> None:
        """Store entries, and add ``(outbound, field, n)`` counters in the same write."""
        ...

    # Intake (crawlhub.hub.state.intake): a new task recorded unpushed, then pushed or
    # undone.
    async def intake_beat(self, owner: str, now: float) -> None:
        """Hub process ``owner`` is alive at ``now``."""
        ...

    async def intake_begin(self, items: Sequence[Intake], now: float, owner: str
                           ) -> list[str]:
        """Record tasks whose uuid is new as unpushed by ``owner``; one flag per task
        (N T A D)."""
        ...

    async def intake_free(self, items: Sequence[Intake]) -> list[bool]:
        """Read only: True where an item's uuid is not in the ledger and its gate is not
        held nor released untaken. Such an item whose URL the frontier already admitted
        is a plain duplicate: the hub answers it without recording anything."""
        ...

    async def intake_commit(self, items: Sequence[Intake],
                            counters: Sequence[tuple[str, str, int]] = ()) -> None:
        """Mark recorded tasks pushed (deadlines start, gates free) and add counters."""
        ...

    async def intake_abort(self, items: Sequence[Intake], *, release: bool) -> None:
        """Forget recorded tasks that were not pushed; ``release`` keeps their gates
        for the next task of the same URL to take over."""
        ...

    async def intake_claim(self, now: float, dead_before: float, owner: str,
                           limit: int = 500) -> list[Intake]:
        """Claim for ``owner`` the unpushed records of processes silent since
        ``dead_before`` (recovery)."""
        ...

    async def get(self, task_uuid: str) -> LedgerEntry | None: ...

    async def get_many(self, task_uuids: Sequence[str]) -> dict[str, LedgerEntry]:
        """The entries of those of ``task_uuids`` that are in the ledger, in one read."""
        ...

    async def resolve(self, task_uuid: str) -> LedgerEntry | None:
        """Remove and return the entry; None if unknown or already resolved elsewhere."""
        ...

    async def claim_expired(self, now: float, limit: int = 500, *,
                            lease: float = CLAIM_LEASE) -> list[LedgerEntry]:
        """Lease and return entries whose deadline passed (``pending == "timeout"``) and
        entries whose lease ended before they were settled (a process died handling them:
        ``pending`` says what is left to do). A claimed entry stays in the ledger, leased
        until ``now + lease``: one claimer at a time handles it, and settles it."""
        ...

    async def end_leases(self, now: float) -> int:
        """End every lease at ``now``, so that the next :meth:`claim_expired` takes the
        entries over: for a caller that knows every holder is dead (``crawlhub crawl``
        holds its data dir's lock), instead of waiting out their leases. Returns how
        many it ended."""
        ...

    async def settle(self, current: LedgerEntry, after: LedgerEntry | None,
                     counters: Sequence[tuple[str, str, int]] = (), *,
                     lease_until: float = 0.0) -> bool:
        """Atomically, if the stored entry of ``current``'s task is still ``current.raw``:
        replace it with ``after`` (None: remove it) and add the ``(outbound, field, n)``
        counters. ``after.pending`` set (``push`` / ``fail``) keeps ``after`` leased until
        ``lease_until``, so that if this process dies before doing it, a sweep does;
        ``after.pending`` None makes it wait for its result (and its deadline).
        Returns False, changing nothing, if the entry changed or went meanwhile."""
        ...

    async def settle_many(self, items: Sequence[Settle]) -> list[bool]:
        """:meth:`settle` for each item, in one round trip (one SQLite transaction, one
        Redis pipeline of scripts): each item is applied atomically on its own and only
        if its entry is unchanged, so one item's False changes nothing of the others.
        One flag per item. Two items naming the same task are not allowed."""
        ...

    async def note_dispatched(self, counts: Sequence[tuple[str, int, int]]) -> None:
        """Add ``(outbound, epoch second, n)`` to the dispatch counts every hub process
        reads for the outbound rate (kept for :data:`RATE_KEEP` seconds)."""
        ...

    async def dispatched_in(self, first: int, last: int) -> dict[str, int]:
        """Tasks dispatched per outbound by every hub process in the epoch seconds
        ``first`` to ``last`` (both included)."""
        ...

    async def incr(self, outbound: str, field: str, n: int = 1) -> None: ...

    async def incr_many(self, items: Sequence[tuple[str, str, int]]) -> None: ...

    async def counters(self) -> dict[str, dict[str, int]]: ...

    async def take_tokens(self, scope: str, rate: float, n: int, burst: float) -> float:
        """Take ``n`` tokens from the bucket of ``scope`` if all are there and return 0;
        otherwise take none and return the seconds until they will be."""
        ...

    async def pending(self) -> int:
        """Entries waiting for a result."""
        ...

    async def close(self) -> None: ...


def _dumps(entry: LedgerEntry) -> str:
    if entry.failure is not None:
        return jsoncodec.dumps({"t": entry.task, "o": entry.outbound, "d": entry.deadline,
                                "f": entry.failure})
    return jsoncodec.dumps({"t": entry.task, "o": entry.outbound, "d": entry.deadline})


def _loads(raw: str | bytes, pending: str | bytes | None = None) -> LedgerEntry:
    data = jsoncodec.loads(raw)
    if isinstance(pending, bytes):
        pending = pending.decode()
    return LedgerEntry(task=data["t"], outbound=data["o"], deadline=data["d"],
                       pending=pending, failure=data.get("f"), raw=raw)


def _text(raw: str | bytes | None) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


def _bucket(tokens: float, stamp: float, now: float, rate: float, n: int, burst: float
            ) -> tuple[float, float]:
    """Refill then try to take ``n``: returns (tokens left, seconds to wait or 0)."""
    tokens = min(burst, tokens + max(0.0, now - stamp) * rate)
    if tokens >= n:
        return tokens - n, 0.0
    return tokens, (n - tokens) / rate

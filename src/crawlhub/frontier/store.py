"""The seed store protocol: admission (dedup filter + seed record in one step), leases,
finishing and per-segment counts. Backends: sqlite.py (embedded) and redis.py, opened by
``open_store`` (open.py).

Seeds are keyed by (segment, key). States: pending (ready now, or waiting for its
``ready_at``), leased (until ``lease_until``), done, failed, and dispatched (admitted by
the hub, which routed the task itself). A lease never deletes a seed; an expired lease
returns it to pending. Finished seeds stay (archived) until their segment is pruned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from crawlhub.core.errors import FrontierError
from crawlhub.frontier.seed import Outcome, Seed
from crawlhub.frontier.validators import Validators


@dataclass(slots=True)
class Entry:
    """A seed on its way into the store, with everything the frontier resolved for it."""

    seed: Seed
    segment: int
    key: str
    #: stable 128-bit hash of ``key`` (bloom filter input)
    hash: int
    #: Unix time from which it may be leased
    ready_at: float
    #: True: admitted by the hub and routed at once; recorded, never leased
    dispatched: bool = False


@dataclass(slots=True)
class SegmentCounts:
    """Counters of one segment, as ``GET /frontier/`` and ``crawlhub frontier stats`` show."""

    segment: int
    admitted: int = 0
    duplicates: int = 0
    pending: int = 0
    leased: int = 0
    done: int = 0
    failed: int = 0
    dispatched: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class SeedStore(Protocol):
    """Storage of one named frontier. All times are Unix seconds given by the caller."""

    name: str
    url: str

    async def open(self) -> None:
        """Create tables/scripts and restore the dedup filter (snapshot + write-ahead)."""
        ...

    async def close(self) -> None:
        """Snapshot what needs it and release connections."""
        ...

    async def admit(self, entries: Sequence[Entry], now: float, *, exact: bool) -> list[bool]:
        """Test-and-set every entry's key in its segment's filter and store the new ones,
        atomically per key (two processes never both admit one key in one segment).
        ``exact``: confirm filter positives against the stored keys. True = admitted."""
        ...

    async def duplicates(self, entries: Sequence[Entry], *, exact: bool) -> list[bool]:
        """Which entries' keys are already admitted in their segments (``exact``: stored;
        else the filter has them, as ``admit`` would judge), counted as duplicates.
        Stores nothing else: a key not found is left to ``admit``. Cheaper than ``admit``
        for a batch of mostly known keys (a read, no write transaction)."""
        ...

    async def admitted_by(self, segment: int, key: str) -> str | None:
        """The ``task_uuid`` in the meta of the seed stored under (segment, key): which
        hub task the key was admitted for (None: not stored, or not a hub task)."""
        ...

    async def claim(self, n: int, now: float, lease_until: float) -> list[Seed]:
        """Lease up to ``n`` pending seeds whose ``ready_at`` has come, highest priority
        first, FIFO within a priority; expired leases return to pending first."""
        ...

    async def extend(self, seeds: Sequence[Seed], lease_until: float) -> list[bool]:
        """Move the lease deadline of still-leased seeds; False where no longer leased."""
        ...

    async def release(self, seeds: Sequence[Seed]) -> int:
        """Return leased seeds to pending at once (a cache given back on close)."""
        ...

    async def finish(
        self, done: Sequence[tuple[Seed, Outcome]], now: float, ready_at: float
    ) -> list[bool]:
        """Per (seed, outcome), in one transaction (on Redis, one script per 1000 seeds):
        ok -> done, failed -> failed (both archived), retry -> pending from ``ready_at``.
        Only a pending or leased seed changes; returns whether each did."""
        ...

    async def next_due(self, now: float) -> float | None:
        """When the next seed becomes leasable (<= now: one is ready), None: nothing owed."""
        ...

    async def counts(self, now: float) -> list[SegmentCounts]:
        """Counters of every segment the store holds, oldest first."""
        ...

    async def snapshot(self, current_segment: int) -> None:
        """Persist the dedup filter if it lives in this process; filters of segments
        before ``current_segment`` may be freed (they are rebuilt on demand)."""
        ...

    async def prune(self, before_segment: int) -> list[int]:
        """Delete segments before ``before_segment`` that owe no seed (none pending or
        leased): their seeds, counters and filters. Returns the segments deleted."""
        ...

    async def wait_signal(self, timeout: float) -> None:
        """Return when another process signals new ready seeds, or after ``timeout``."""
        ...

    async def filter_bytes(self) -> int:
        """Bytes the dedup filters occupy (bit arrays in memory or in Redis)."""
        ...

    async def purge(self) -> None:
        """Drop every seed, counter and filter of this frontier (tests, admin)."""
        ...

    async def validators(self, keys: Sequence[str]) -> dict[str, Validators]:
        """The validators kept for ``keys`` (:mod:`crawlhub.frontier.validators`), of any
        segment: those of a key never answered are absent."""
        ...

    async def remember(self, items: Sequence[tuple[str, Validators]]) -> None:
        """Keep each key's validators (replacing older ones), in one step."""
        ...

    async def stored(self, segment: int, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` ``segment`` admitted, looked up in the stored keys (not the
        filters: a past segment's filter is dropped at the next snapshot); counts
        nothing. A recrawl asks it which links its archive knows."""
        ...

    async def archived(self, segment: int, cursor: str, count: int) -> tuple[str, list[Seed]]:
        """One page of the seeds ``segment`` admitted, from ``cursor`` ("" first): the
        next cursor ("" when done) and the seeds - what a recrawl admits again."""
        ...


def task_uuid_of(encoded: str | bytes) -> str | None:
    """The ``task_uuid`` in the meta of a stored seed (``Seed.encode``'s form), which every
    store's ``admitted_by`` answers (None: not a hub task)."""
    uuid = Seed.decode(encoded).meta.get("task_uuid")
    return None if uuid is None else str(uuid)


def check_entries(entries: Sequence[Entry]) -> None:
    for e in entries:
        if not e.key:
            raise FrontierError(f"seed {e.seed.url!r} resolved to an empty key: fix key.function")

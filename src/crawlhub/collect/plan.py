"""Pure planning for collection jobs: which offsets, pages and time windows to request.

No I/O here: planners take a total, the saved state and sizes and return requests, so
every strategy's request sequence can be tested by itself (seed 000's worked examples).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True, slots=True)
class Sweep:
    """One newest-first walk down a paged source.

    The walk requests the window ``[max(next, 0), next + size)`` and steps ``next`` down by
    ``size`` while the window still reaches above ``floor`` (items below ``floor`` were
    covered by an earlier run). ``next`` may go negative: the last window is then clamped
    at offset 0 with a shorter limit, so the oldest items are never skipped.
    ``expire_stop`` marks a first-run sweep, which ends after ``max_expired_batches``
    consecutive all-expired batches; ``expired`` is that running count.
    """

    next: int
    floor: int
    size: int
    expire_stop: bool = False
    expired: int = 0

    @property
    def done(self) -> bool:
        return self.next + self.size <= max(self.floor, 0)

    def request(self) -> tuple[int, int] | None:
        """The ``(offset, limit)`` to request now, or None when the sweep is complete."""
        if self.done:
            return None
        offset = max(self.next, 0)
        return offset, self.next + self.size - offset

    def after_batch(self, *, all_expired: bool, max_expired_batches: int) -> Sweep:
        """The sweep once the current batch is delivered (possibly ended by expiry)."""
        expired = self.expired + 1 if all_expired else 0
        if self.expire_stop and expired >= max_expired_batches:
            # Old enough: the rest of the first-run sweep is past filter_days.
            return replace(self, next=self.floor - self.size, expired=expired)
        return replace(self, next=self.next - self.size, expired=expired)

    def to_dict(self) -> dict[str, Any]:
        return {
            "next": self.next,
            "floor": self.floor,
            "size": self.size,
            "expire_stop": self.expire_stop,
            "expired": self.expired,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sweep:
        return cls(
            next=int(data["next"]),
            floor=int(data["floor"]),
            size=int(data["size"]),
            expire_stop=bool(data.get("expire_stop", False)),
            expired=int(data.get("expired", 0)),
        )


@dataclass(slots=True)
class IncrementalState:
    """What an incremental job remembers between runs (kept in the metadata store).

    ``covered_total``: every offset below it was planned by some run (the seed keeps
    ``last_start_offset`` instead, which breaks when ``batch_size`` changes).
    ``sweeps``: work still pending, newest first: a stopped or crashed run leaves its
    remainder here and the next run finishes it, so nothing between runs is missed.
    """

    covered_total: int | None = None
    last_start_offset: int | None = None
    sweeps: list[Sweep] = field(default_factory=list)

    @property
    def first_run(self) -> bool:
        return self.covered_total is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "covered_total": self.covered_total,
            "last_start_offset": self.last_start_offset,
            "sweeps": [s.to_dict() for s in self.sweeps],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> IncrementalState:
        if not data:
            return cls()
        return cls(
            covered_total=data.get("covered_total"),
            last_start_offset=data.get("last_start_offset"),
            sweeps=[Sweep.from_dict(s) for s in data.get("sweeps", [])],
        )


def plan_incremental(
    total: int, state: IncrementalState, batch_size: int, *, overlap: int = 0
) -> IncrementalState:
    """The state a run starts from: a new sweep over items added since the last run.

    First run: walk from ``total - batch_size`` down to 0 (stopping early on expiry).
    Later runs: walk from ``total - batch_size`` down to the previous run's total
    (``overlap`` items lower, to re-read a margin), then finish any pending sweeps.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    sweeps = list(state.sweeps)
    covered = state.covered_total
    if covered is None:
        new = Sweep(next=total - batch_size, floor=0, size=batch_size, expire_stop=True)
    elif total > covered:
        new = Sweep(next=total - batch_size, floor=max(covered - overlap, 0), size=batch_size)
    else:
        new = None  # nothing added (or the source shrank: offsets below stay as planned)
    if new is not None and not new.done:
        sweeps.insert(0, new)
    return IncrementalState(
        covered_total=total if covered is None else max(covered, total),
        last_start_offset=max(total - batch_size, 0),
        sweeps=sweeps,
    )


def incremental_requests(
    total: int,
    state: IncrementalState,
    batch_size: int,
    *,
    expired: Iterator[bool] | None = None,
    max_expired_batches: int = 3,
    overlap: int = 0,
) -> list[tuple[int, int]]:
    """Every ``(offset, limit)`` a complete run would request (for tests and the bench).

    ``expired`` yields, per batch in order, whether that batch was all expired.
    """
    run = plan_incremental(total, state, batch_size, overlap=overlap)
    out: list[tuple[int, int]] = []
    for sweep in run.sweeps:
        while (req := sweep.request()) is not None:
            out.append(req)
            all_expired = next(expired, False) if expired is not None else False
            sweep = sweep.after_batch(
                all_expired=all_expired, max_expired_batches=max_expired_batches
            )
    return out


@dataclass(frozen=True, slots=True)
class PageRequest:
    """One forward page: offset/limit for offset paging, page/size for page paging."""

    offset: int
    limit: int
    page: int


def forward_pages(
    limit: int, *, start_page: int = 1, start_offset: int = 0
) -> Iterator[PageRequest]:
    """Pages from the start, forward; the caller stops on a short page or the total."""
    offset = start_offset
    page = start_page + start_offset // limit
    while True:
        yield PageRequest(offset=offset, limit=limit, page=page)
        offset += limit
        page += 1


def forward_done(page: PageRequest, returned: int, total: int | None) -> bool:
    """True when a forward scan has read everything after ``page`` returned ``returned``."""
    if returned < page.limit:
        return True
    return total is not None and page.offset + page.limit >= total


def window_segments(
    start: datetime, end: datetime, segment: timedelta
) -> list[tuple[datetime, datetime]]:
    """Split ``[start, end)`` into consecutive segments of ``segment`` (last one shorter)."""
    if segment <= timedelta(0):
        raise ValueError(f"segment must be a positive duration, got {segment}")
    out: list[tuple[datetime, datetime]] = []
    cur = start
    while cur < end:
        nxt = min(cur + segment, end)
        out.append((cur, nxt))
        cur = nxt
    return out

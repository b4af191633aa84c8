"""The sink protocol: where the pipeline's single writer puts records, one batch at a time.

A batch is written in one transaction: all of it lands or none of it does. Writes are
idempotent: a redelivered record never doubles a row (sinks key records).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(slots=True)
class BatchResult:
    """What one batch did: rows inserted, updated, skipped as unchanged, failed."""

    inserted: int = 0
    updated: int = 0
    skipped: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def written(self) -> int:
        return self.inserted + self.updated

    def add(self, other: BatchResult) -> None:
        self.inserted += other.inserted
        self.updated += other.updated
        self.skipped += other.skipped
        self.failed += other.failed
        self.errors.extend(other.errors)


@runtime_checkable
class Sink(Protocol):
    """A store records are written to. Callers: the pipeline writer (one per run)."""

    name: str

    async def open(self) -> None: ...

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        """Write records in one transaction; raise ``SinkError`` to roll the batch back."""
        ...

    async def close(self) -> None: ...

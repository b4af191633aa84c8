"""The sink protocol: where the pipeline's single writer puts records, one batch at a time.

A batch is written in one transaction: all of it lands or none of it does. Writes are
idempotent: a redelivered record never doubles a row (sinks key records).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from crawlhub.core.configtypes import new_list


def key_list(value: Any) -> Any:
    """``key: id`` and ``key: [shop_id, id]`` both work."""
    return [value] if isinstance(value, str) else value


class SinkModel(BaseModel):
    """A sink's config model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class SinkConfig(SinkModel):
    """What every sink has: its name, the record fields forming the key, hash exclusions."""

    type: str
    name: str | None = None
    key: list[str] = Field(default_factory=lambda: ["id"], min_length=1)
    #: Fields stored but not hashed: a change in them alone is not an update.
    hash_exclude: list[str] = Field(default_factory=new_list)

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> Any:
        return key_list(value)


@dataclass(slots=True)
class TableResult:
    """What one table did in a multi-table write (each table has its own transaction)."""

    table: str
    inserted: int = 0
    updated: int = 0
    skipped: int = 0
    failed: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(slots=True)
class BatchResult:
    """What one batch did: rows inserted, updated, skipped as unchanged, failed.

    ``tables`` is filled by sinks that write several tables, one transaction each
    (PostgreSQL with ``route_field``): a failed table's records count as ``failed``
    while the other tables' records are committed.
    """

    inserted: int = 0
    updated: int = 0
    skipped: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    tables: dict[str, TableResult] = field(default_factory=dict)

    @property
    def written(self) -> int:
        return self.inserted + self.updated

    def add(self, other: BatchResult) -> None:
        self.inserted += other.inserted
        self.updated += other.updated
        self.skipped += other.skipped
        self.failed += other.failed
        self.errors.extend(other.errors)
        for name, table in other.tables.items():
            mine = self.tables.setdefault(name, TableResult(name))
            mine.inserted += table.inserted
            mine.updated += table.updated
            mine.skipped += table.skipped
            mine.failed += table.failed
            mine.error = table.error or mine.error


@runtime_checkable
class Sink(Protocol):
    """A store records are written to. Callers: the pipeline writer (one per run)."""

    name: str

    async def open(self) -> None: ...

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        """Write records in one transaction; raise ``SinkError`` to roll the batch back."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class SnapshotSink(Sink, Protocol):
    """A sink that can soft-delete what a full snapshot did not deliver (PostgreSQL).

    Between ``begin_snapshot`` and ``finish_snapshot`` every written or unchanged record
    is marked seen; ``finish_snapshot`` marks the rows not seen as deleted and returns
    how many per table. A run that fails or is cancelled calls ``abandon_snapshot``
    instead, so a partial snapshot deletes nothing.
    """

    async def begin_snapshot(self, snapshot_id: str | None = None) -> str: ...

    async def finish_snapshot(self, snapshot_id: str | None = None) -> dict[str, int]: ...

    async def abandon_snapshot(self) -> None: ...

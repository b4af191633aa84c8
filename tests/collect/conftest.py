"""Fixtures for collect tests: a lazily generated paged source, a store, job configs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, overload

import pytest

from crawlhub.collect.config import CollectJobConfig
from crawlhub.collect.store import SqlMetadataStore, open_metadata_store
from crawlhub.sinks.base import BatchResult
from tests.httpapi import DATE_FORMAT, ApiServer


class LazyItems(Sequence[dict[str, Any]]):
    """``total`` items made on demand by offset: id ``i``; dated fresh at ``>= fresh_from``,
    30 days old below it. ``total`` may grow between runs (new items at the end)."""

    def __init__(self, total: int, *, fresh_from: int = 0) -> None:
        self.total = total
        self.fresh_from = fresh_from
        now = datetime.now().replace(microsecond=0)
        self._fresh = (now - timedelta(hours=1)).strftime(DATE_FORMAT)
        self._old = (now - timedelta(days=30)).strftime(DATE_FORMAT)

    def __len__(self) -> int:
        return self.total

    def item(self, i: int) -> dict[str, Any]:
        return {"id": i, "name": f"item-{i}", "date": self._fresh if i >= self.fresh_from else self._old}

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self.item(i) for i in range(*index.indices(self.total))]
        if not -self.total <= index < self.total:
            raise IndexError(index)
        return self.item(index % self.total)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self.item(i) for i in range(self.total))


class ListSink:
    """A sink keeping written records in memory, keyed by id (idempotent like real sinks)."""

    name = "memory"

    def __init__(self) -> None:
        self.rows: dict[Any, dict[str, Any]] = {}
        self.batches: list[int] = []
        self.fail_next = 0

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        if self.fail_next:
            self.fail_next -= 1
            from crawlhub.core.errors import SinkError

            raise SinkError("memory sink: injected failure, batch rolled back")
        self.batches.append(len(records))
        out = BatchResult()
        for r in records:
            if r["id"] in self.rows:
                out.updated += 1
            else:
                out.inserted += 1
            self.rows[r["id"]] = dict(r)
        return out


def list_offsets(api: ApiServer) -> list[tuple[int, int]]:
    """``(offset, limit)`` of every list request the server received, in order."""
    return [
        (int(r.query["offset"]), int(r.query["limit"]))
        for r in api.log
        if r.path == "/items" and "offset" in r.query
    ]


def job_config(url: str, name: str = "news", **over: Any) -> CollectJobConfig:
    """A job against the test API: no rate gaps, dates in the server's format."""
    data: dict[str, Any] = {
        "name": name,
        "source": {
            "url": f"{url}/items",
            "items_path": "items",
            "total_path": "total",
            "date_field": "date",
            "date_format": DATE_FORMAT,
            "error_field": "code",
            "ok_values": [0],
        },
        "strategy": {"type": "incremental", "batch_size": 100, "filter_days": 7},
        "pipeline": {"rate_min": 0, "rate_max": 0, "batch_timeout": 0.05, "progress_interval": 0},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return CollectJobConfig.model_validate(data)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqlMetadataStore]:
    s = await open_metadata_store(f"sqlite:///{tmp_path}/meta.db")
    yield s
    await s.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def any_store(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> AsyncIterator[SqlMetadataStore]:
    """The metadata store on each backend (PostgreSQL tables dropped afterwards)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/meta.db"
    else:
        url = request.getfixturevalue("postgres_url")
    s = await open_metadata_store(url, table_prefix=f"{unique_name}_")
    yield s
    if request.param == "postgres":
        for table in (s.progress_table, s.cursors_table, s.runs_table, s.leases_table,
                      s.detail_table, s.log_table):
            await s._execute(f"DROP TABLE IF EXISTS {table}")
    await s.close()


def write_news_config(tmp_path: Path, url: str, **job: Any) -> Path:
    """A config file with one collection job ``news`` over ``url``'s paged ``/items``, into
    ``news.jsonl``; ``job`` replaces sections of that job (``detail=``, ``sink=``, ...)."""
    import yaml

    news = {
        "name": "news",
        "source": {"url": f"{url}/items", "items_path": "items", "total_path": "total",
                   "date_field": "date", "date_format": DATE_FORMAT,
                   "error_field": "code", "ok_values": [0]},
        "strategy": {"type": "incremental", "batch_size": 100},
        "pipeline": {"rate_min": 0, "rate_max": 0, "progress_interval": 0},
        "sink": {"type": "jsonl", "path": str(tmp_path / "news.jsonl")},
        **job,
    }
    path = tmp_path / "crawlhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "jobs": [news]}))
    return path

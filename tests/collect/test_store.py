"""Metadata store conformance: SQLite and PostgreSQL keep progress, cursors and runs alike."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.collect.store import Progress, RunRecord, SqlMetadataStore, open_store, store_for
from crawlhub.errors import ConfigError


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> AsyncIterator[SqlMetadataStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/meta.db"
    else:
        url = request.getfixturevalue("postgres_url")
    s = await open_store(url, table_prefix=f"{unique_name}_")
    yield s
    if request.param == "postgres":
        for table in (s.progress_table, s.cursors_table, s.runs_table):
            await s._execute(f"DROP TABLE IF EXISTS {table}")
    await s.close()


async def test_progress_is_none_until_saved(store: SqlMetadataStore) -> None:
    assert await store.load_progress("news") is None


async def test_progress_round_trips_and_updates_in_place(store: SqlMetadataStore) -> None:
    p = Progress(
        job="news",
        run_id="r1",
        status="running",
        start_offset=257349,
        saved_offset=257249,
        last_total=257449,
        state={"sweeps": [{"next": 1}]},
    )
    await store.save_progress(p)
    p.saved_offset = 257149
    p.state = {"sweeps": []}
    await store.save_progress(p)
    got = await store.load_progress("news")
    assert got is not None
    assert (got.run_id, got.status, got.start_offset, got.saved_offset, got.last_total) == (
        "r1",
        "running",
        257349,
        257149,
        257449,
    )
    assert got.state == {"sweeps": []}
    assert got.updated_at > 0


async def test_cursors_are_per_job_and_name(store: SqlMetadataStore) -> None:
    assert await store.get_cursor("a", "window") is None
    await store.set_cursor("a", "window", "2024-01-01T00:00:00+00:00")
    await store.set_cursor("a", "window", "2024-01-02T00:00:00+00:00")
    await store.set_cursor("b", "window", "x")
    assert await store.get_cursor("a", "window") == "2024-01-02T00:00:00+00:00"
    assert await store.get_cursor("b", "window") == "x"


async def test_runs_are_listed_newest_first_with_result_and_log(store: SqlMetadataStore) -> None:
    t = time.time()
    for i in range(3):
        await store.start_run(
            RunRecord(
                run_id=f"r{i}",
                job="news",
                strategy="incremental",
                status="running",
                started_at=t + i,
            )
        )
    done = RunRecord(
        run_id="r1",
        job="news",
        strategy="incremental",
        status="SUCCEEDED",
        started_at=t + 1,
        finished_at=t + 2,
        result={"status": "SUCCEEDED"},
        log=["line 1", "line 2"],
    )
    await store.finish_run(done)
    runs = await store.runs("news", limit=2)
    assert [r.run_id for r in runs] == ["r2", "r1"]
    assert runs[1].result == {"status": "SUCCEEDED"}
    assert runs[1].log == ["line 1", "line 2"]
    assert runs[0].result is None and runs[0].finished_at is None


async def test_open_is_idempotent(store: SqlMetadataStore) -> None:
    await store.save_progress(Progress(job="j"))
    await store.open()
    assert await store.load_progress("j") is not None


def test_unknown_metadata_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="storage.metadata"):
        store_for("mysql://x")
    with pytest.raises(ConfigError, match="table prefix"):
        store_for("sqlite:///x.db", table_prefix="bad; drop")

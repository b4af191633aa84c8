"""Metadata store conformance: SQLite and PostgreSQL keep progress, cursors and runs alike."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.collect.store import (
    JobRunRecord,
    Lease,
    Progress,
    SqlMetadataStore,
    open_metadata_store,
    store_for,
)
from crawlhub.core.errors import ConfigError


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> AsyncIterator[SqlMetadataStore]:
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
            JobRunRecord(
                run_id=f"r{i}",
                job="news",
                strategy="incremental",
                status="running",
                started_at=t + i,
            )
        )
    done = JobRunRecord(
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


# ---- run leases -----------------------------------------------------------------------------
async def take(store: SqlMetadataStore, owner: str, now: float, **over: object) -> Lease:
    options: dict = {"run_id": f"run-{owner}", "pid": 4242, "host": "h1", "ttl": 30.0}
    options.update(over)
    return await store.acquire_lease("news", owner, now=now, **options)


async def test_a_lease_is_taken_once_until_it_expires(store: SqlMetadataStore) -> None:
    first = await take(store, "a", now=1000.0)
    assert (first.owner, first.since, first.expires_at, first.pid) == ("a", 1000.0, 1030.0, 4242)
    held = await take(store, "b", now=1029.0)
    assert held.owner == "a" and held.run_id == "run-a"  # b learns who holds it
    assert (await store.lease("news")) == first
    taken = await take(store, "b", now=1030.0, pid=7)  # expired: b takes it over
    assert taken.owner == "b" and taken.pid == 7 and taken.since == 1030.0


async def test_renewing_keeps_the_lease_and_fails_once_it_was_taken_over(
    store: SqlMetadataStore,
) -> None:
    await take(store, "a", now=1000.0)
    renewed = await store.renew_lease("news", "a", now=1025.0, ttl=30.0)
    assert renewed is not None and renewed.expires_at == 1055.0
    assert (await take(store, "b", now=1040.0)).owner == "a"
    assert (await take(store, "b", now=1055.0)).owner == "b"
    assert await store.renew_lease("news", "a", now=1056.0, ttl=30.0) is None


async def test_a_lease_known_dead_is_taken_over_before_it_expires(
    store: SqlMetadataStore,
) -> None:
    await take(store, "a", now=1000.0)
    assert (await take(store, "b", now=1001.0, take_from="someone-else")).owner == "a"
    assert (await take(store, "b", now=1001.0, take_from="a")).owner == "b"


async def test_release_frees_the_lease_for_its_owner_only(store: SqlMetadataStore) -> None:
    await take(store, "a", now=1000.0)
    await store.release_lease("news", "b")
    assert await store.lease("news") is not None
    await store.release_lease("news", "a")
    assert await store.lease("news") is None
    assert (await take(store, "b", now=1001.0)).owner == "b"


async def test_a_stop_request_reaches_the_holder_on_its_next_renewal(
    store: SqlMetadataStore,
) -> None:
    assert await store.request_stop("news", "stopped by request") is None  # nobody runs it
    await take(store, "a", now=1000.0)
    asked = await store.request_stop("news", "stopped by request")
    assert asked is not None and asked.owner == "a"
    renewed = await store.renew_lease("news", "a", now=1010.0, ttl=30.0)
    assert renewed is not None and renewed.stop == "stopped by request"
    assert (await take(store, "b", now=1041.0)).stop is None  # a new holder starts clean


# ---- pending detail ids ---------------------------------------------------------------------
async def test_detail_ids_are_a_set_per_job_read_oldest_first(store: SqlMetadataStore) -> None:
    await store.add_detail_ids("news", [3, 1, "x-2"])
    await store.add_detail_ids("news", [1, 7])
    await store.add_detail_ids("other", [1])
    assert await store.detail_ids("news") == [3, 1, "x-2", 7]
    assert await store.detail_ids("news", limit=2) == [3, 1]
    assert await store.count_detail_ids("news") == 4
    await store.remove_detail_ids("news", [1, "x-2", 99])
    assert await store.detail_ids("news") == [3, 7]
    assert await store.detail_ids("other") == [1]
    assert await store.count_detail_ids("nobody") == 0


# ---- recent log lines -----------------------------------------------------------------------
async def test_log_lines_are_kept_per_job_and_bounded(store: SqlMetadataStore) -> None:
    lines = [{"ts": 1000.0 + i, "level": "info", "job": "news", "event": f"e{i}", "n": i}
             for i in range(12)]
    await store.append_log("news", lines[:5], keep=8)
    await store.append_log("news", lines[5:], keep=8)
    await store.append_log("other", [{"ts": 1.0, "level": "info", "job": "other",
                                      "event": "x"}], keep=8)
    got = await store.log_lines("news", 100)
    assert [line["event"] for line in got] == [f"e{i}" for i in range(4, 12)]
    assert got[-1] == lines[-1]
    assert [line["event"] for line in await store.log_lines("news", 2)] == ["e10", "e11"]
    assert [line["event"] for line in await store.log_lines("other", 5)] == ["x"]
    assert await store.log_lines("news", 0) == []

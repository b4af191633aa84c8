"""What only the embedded store does: bloom snapshots on disk, the table as their
write-ahead log, and freeing the filters of past segments."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from crawlhub.frontier import Seed
from crawlhub.frontier.bloom import stable_hash
from crawlhub.frontier.sqlite import SqliteSeedStore

from .conftest import DAY, Clock, MakeFrontier


@pytest.fixture
def backend() -> str:
    return "sqlite"


def manifest(store: SqliteSeedStore) -> dict:  # type: ignore[type-arg]
    return json.loads((store.snapshot_dir / "manifest.json").read_text())


async def test_close_snapshots_the_filter_beside_the_database(
    make_frontier: MakeFrontier, tmp_path: Path
) -> None:
    f = await make_frontier("news")
    await f.admit([Seed("http://a.com/1"), Seed("http://a.com/2")])
    await f.close()
    store = f.store
    assert isinstance(store, SqliteSeedStore)
    assert store.snapshot_dir == tmp_path / "frontier.db-bloom" / "news"
    assert manifest(store)["watermark"] == 2
    assert (store.snapshot_dir / f"segment-{f.current_segment()}.bloom").exists()


async def test_restore_replays_rows_after_the_snapshot(make_frontier: MakeFrontier) -> None:
    a = await make_frontier()
    await a.admit([Seed("http://a.com/old")])
    await a.snapshot()
    await a.admit([Seed("http://a.com/new")])
    await a.store.close()  # as after kill -9: the last admission is only in the table
    b = await make_frontier()
    store = b.store
    assert isinstance(store, SqliteSeedStore)
    bloom = store._blooms[b.current_segment()]  # loaded from the snapshot, not rebuilt
    assert stable_hash("http://a.com/new") in bloom


async def test_the_snapshot_timer_writes_snapshots(make_frontier: MakeFrontier) -> None:
    f = await make_frontier(snapshot_interval=0.05)
    await f.admit([Seed("http://a.com/1")])
    store = f.store
    assert isinstance(store, SqliteSeedStore)
    for _ in range(100):
        if (store.snapshot_dir / "manifest.json").exists() and manifest(store)["watermark"]:
            break
        await asyncio.sleep(0.05)
    assert manifest(store)["watermark"] == 1


async def test_filters_of_past_segments_are_freed_and_rebuilt_on_demand(
    make_frontier: MakeFrontier, clock: Clock
) -> None:
    f = await make_frontier()
    first = f.current_segment()
    await f.admit([Seed("http://a.com/1")])
    clock.advance(DAY)
    await f.snapshot()
    store = f.store
    assert isinstance(store, SqliteSeedStore)
    assert first not in store._blooms
    clock.advance(-DAY)  # a late admission into the old segment still deduplicates
    assert await f.admit([Seed("http://a.com/1")]) == [False]


async def test_duplicate_counts_survive_a_restart(make_frontier: MakeFrontier) -> None:
    a = await make_frontier()
    await a.admit([Seed("http://a.com/1"), Seed("http://a.com/1")])
    await a.close()
    b = await make_frontier()
    assert (await b.stats())[0]["duplicates"] == 1

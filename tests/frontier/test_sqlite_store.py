"""What only the embedded store does: bloom snapshots on disk, the table as their
write-ahead log, freeing the filters of past segments, the two-tier key index and the
upgrade of tables from before it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from crawlhub.frontier import Seed
from crawlhub.frontier import sqlite as sqlite_store
from crawlhub.frontier.bloom import stable_hash
from crawlhub.frontier.sqlite import SqliteSeedStore
from tests.helpers import FakeClock, wait_for

from .conftest import DAY, MakeFrontier


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
    await wait_for(lambda: (store.snapshot_dir / "manifest.json").exists()
                   and manifest(store)["watermark"], "the timer's first snapshot")
    assert manifest(store)["watermark"] == 1


async def test_filters_of_past_segments_are_freed_and_rebuilt_on_demand(
    make_frontier: MakeFrontier, clock: FakeClock
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


async def test_keys_are_found_in_either_tier_of_the_index(
    make_frontier: MakeFrontier, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "RECENT_MAX", 4)  # "recent" moves to "keys" often
    f = await make_frontier(exact=True, cache_size=0)  # exact: every key is looked up
    urls = [f"http://a.com/{i}" for i in range(10)]
    for url in urls:
        assert await f.admit([Seed(url)]) == [True]
    assert await f.admit([Seed(u) for u in urls]) == [False] * 10
    leased = await f.lease(10, 60)
    assert len(leased) == 10
    assert all([await f.finish(s, "ok") for s in leased])  # rows found through both tiers
    (row,) = await f.stats()
    assert (row["done"], row["duplicates"]) == (10, 10)


async def test_a_table_from_before_the_hash_index_is_upgraded(
    make_frontier: MakeFrontier, tmp_path: Path, clock: FakeClock
) -> None:
    segment = int(clock() // DAY)
    with sqlite3.connect(tmp_path / "frontier.db") as conn:
        conn.executescript(
            """
            CREATE TABLE "frontier:f" (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, segment INTEGER NOT NULL,
                key TEXT NOT NULL, state INTEGER NOT NULL, priority INTEGER NOT NULL,
                ready_at REAL NOT NULL, lease_until REAL,
                attempts INTEGER NOT NULL DEFAULT 0, seed TEXT NOT NULL);
            CREATE UNIQUE INDEX "frontier:f:key" ON "frontier:f" (segment, key);
            """
        )
        conn.executemany(
            'INSERT INTO "frontier:f" (segment, key, state, priority, ready_at, seed) '
            "VALUES (?, ?, 0, 0, 0, ?)",
            [(segment, f"http://a.com/{i}", f"http://a.com/{i}") for i in range(3)],
        )
    f = await make_frontier(exact=True)
    assert await f.admit([Seed("http://a.com/1"), Seed("http://a.com/9")]) == [False, True]
    (seed, *_) = await f.lease(4, 60)
    assert await f.finish(seed, "ok")


async def test_set_cache_kib_sizes_the_page_cache(make_frontier: MakeFrontier) -> None:
    f = await make_frontier("news")
    store = f.store
    assert isinstance(store, SqliteSeedStore)

    await store.set_cache_kib(8192)

    (size,) = await store.db.run(lambda conn: conn.execute("PRAGMA cache_size").fetchone())
    assert size == -8192
    await f.close()

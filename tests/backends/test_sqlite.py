"""The one SQLite runner: WAL file, schema, transactions; an unreachable file is
``BackendUnavailable`` everywhere (queues, hub state, frontier, collect store)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from crawlhub.backends.sqlite import SqliteDB
from crawlhub.core.errors import BackendUnavailable

SCHEMA = "CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER);" \
         "CREATE INDEX IF NOT EXISTS t_v ON t (v)"


async def test_a_file_opens_in_wal_mode_with_its_schema_and_busy_timeout(tmp_path: Path) -> None:
    db = SqliteDB(f"sqlite:///{tmp_path}/deep/dir/x.db", schema=SCHEMA, busy_timeout=12.5)
    try:
        mode, timeout, tables = await db.run(lambda c: (
            c.execute("PRAGMA journal_mode").fetchone()[0],
            c.execute("PRAGMA busy_timeout").fetchone()[0],
            {r[0] for r in c.execute("SELECT name FROM sqlite_master")},
        ))
    finally:
        await db.close()
    assert (mode, timeout) == ("wal", 12500)
    assert {"t", "t_v"} <= tables


async def test_all_calls_run_on_one_thread(tmp_path: Path) -> None:
    import threading

    db = SqliteDB(tmp_path / "x.db")
    try:
        names = {await db.run(lambda _: threading.current_thread().name) for _ in range(5)}
    finally:
        await db.close()
    assert len(names) == 1 and names.pop().startswith("crawlhub-sqlite")


async def test_a_failing_transaction_leaves_nothing_behind(tmp_path: Path) -> None:
    db = SqliteDB(tmp_path / "x.db", schema=SCHEMA)

    def write_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES ('a', 1)")
        raise ValueError("stop")

    try:
        with pytest.raises(ValueError):
            await db.transaction(write_then_fail)
        await db.transaction(lambda c: c.execute("INSERT INTO t VALUES ('b', 2)"))
        rows = await db.run(lambda c: c.execute("SELECT k FROM t").fetchall())
    finally:
        await db.close()
    assert rows == [("b",)]


async def test_in_memory_database(tmp_path: Path) -> None:
    db = SqliteDB("sqlite:///:memory:", schema=SCHEMA)
    try:
        await db.run(lambda c: c.execute("INSERT INTO t VALUES ('a', 1)"))
        assert await db.run(lambda c: c.execute("SELECT v FROM t").fetchone()[0]) == 1
    finally:
        await db.close()


async def test_bad_sql_is_not_an_outage(tmp_path: Path) -> None:
    db = SqliteDB(tmp_path / "x.db")
    try:
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await db.run(lambda c: c.execute("SELECT * FROM missing"))
    finally:
        await db.close()


def unreachable_paths(tmp_path: Path) -> dict[str, Path]:
    """A file in the way of the directory, and a directory where the file should be."""
    (tmp_path / "plain-file").write_text("not a directory")
    (tmp_path / "a-directory.db").mkdir()
    return {"under a file": tmp_path / "plain-file" / "x.db",
            "is a directory": tmp_path / "a-directory.db"}


@pytest.mark.parametrize("case", ["under a file", "is a directory"])
async def test_an_unreachable_file_is_backend_unavailable_and_recovers(
    tmp_path: Path, case: str
) -> None:
    path = unreachable_paths(tmp_path)[case]
    db = SqliteDB(f"sqlite:///{path}", schema=SCHEMA)
    try:
        with pytest.raises(BackendUnavailable, match=f"SQLite file {path}") as e:
            await db.run(lambda c: c.execute("SELECT 1"))
        assert e.value.retry_after > 0
        # the obstacle goes away: the next call opens the file
        if case == "under a file":
            (tmp_path / "plain-file").unlink()
        else:
            (tmp_path / "a-directory.db").rmdir()
        assert await db.run(lambda c: c.execute("SELECT 1").fetchone()[0]) == 1
    finally:
        await db.close()


async def _queue(path: Path) -> None:
    from crawlhub.queues.sqlite import SqliteQueueBackend

    backend = SqliteQueueBackend(f"sqlite:///{path}")
    try:
        await backend.queue("q").push({"n": 1})
    finally:
        await backend.close()


async def _hub_state(path: Path) -> None:
    from crawlhub.hub.state import SqliteHubState

    state = SqliteHubState(f"sqlite:///{path}")
    try:
        await state.pending()
    finally:
        await state.close()


async def _frontier(path: Path) -> None:
    from crawlhub.frontier.sqlite import SqliteSeedStore

    store = SqliteSeedStore(f"sqlite:///{path}", "f", expected_items=100, fp_rate=0.01)
    try:
        await store.open()
    finally:
        await store.close()


async def _collect(path: Path) -> None:
    from crawlhub.collect.store import open_metadata_store

    store = await open_metadata_store(f"sqlite:///{path}")
    await store.close()


async def _jsonl_sink_index(path: Path) -> None:
    from crawlhub.sinks.config import JsonlSinkConfig
    from crawlhub.sinks.jsonl import JsonlSink

    sink = JsonlSink(JsonlSinkConfig(path=path.parent / "out.jsonl", index_path=path))
    try:
        await sink.open()
    finally:
        await sink.close()


@pytest.mark.parametrize("opener", [_queue, _hub_state, _frontier, _collect, _jsonl_sink_index],
                         ids=["queues", "hub state", "frontier", "collect store", "jsonl index"])
async def test_every_sqlite_store_reports_an_unreachable_file_as_backend_unavailable(
    tmp_path: Path, opener: Callable[[Path], Awaitable[None]]
) -> None:
    path = unreachable_paths(tmp_path)["is a directory"]
    with pytest.raises(BackendUnavailable, match="unable to open database file"):
        await opener(path)


async def test_the_page_cache_is_bounded_on_request(tmp_path: Path) -> None:
    db = SqliteDB(tmp_path / "a.db", schema="CREATE TABLE t (x INTEGER)")
    try:
        assert await db.run(lambda c: c.execute("PRAGMA cache_size").fetchone()[0]) == -2000
        await db.set_cache_kib(512)
        assert await db.run(lambda c: c.execute("PRAGMA cache_size").fetchone()[0]) == -512
        with pytest.raises(ValueError, match="positive"):
            await db.set_cache_kib(0)
    finally:
        await db.close()

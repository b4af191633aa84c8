"""JSON lines sink specifics: the batch append is undone on failure and after a crash,
and a lost sidecar index is rebuilt from the file."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from crawlhub.core.errors import SinkError
from crawlhub.sinks import JsonlSink
from crawlhub.sinks.config import build_sink
from tests.helpers import wait_for


async def open_sink(path: Path) -> JsonlSink:
    sink = build_sink({"type": "jsonl", "path": str(path)})
    assert isinstance(sink, JsonlSink)
    await sink.open()
    return sink


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_failed_fsync_truncates_the_append_and_keeps_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.jsonl"
    sink = await open_sink(path)
    await sink.write_batch([{"id": 1}])

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(SinkError, match="rolled back"):
        await sink.write_batch([{"id": 2}, {"id": 3}])
    monkeypatch.undo()
    assert lines(path) == [{"id": 1}]
    result = await sink.write_batch([{"id": 2}, {"id": 3}])  # not mistaken for redelivery
    await sink.close()
    assert result.inserted == 2
    assert [r["id"] for r in lines(path)] == [1, 2, 3]


async def test_a_tail_left_by_a_crash_mid_batch_is_cut_off_on_open(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = await open_sink(path)
    await sink.write_batch([{"id": 1}])
    await sink.close()
    with open(path, "ab") as f:  # appended, then the process died before the index commit
        f.write(b'{"id":2}\n{"id":')
    sink = await open_sink(path)
    result = await sink.write_batch([{"id": 2}])
    await sink.close()
    assert result.inserted == 1
    assert lines(path) == [{"id": 1}, {"id": 2}]


async def test_opening_while_another_writer_is_mid_batch_cuts_none_of_its_lines(
        tmp_path: Path) -> None:
    # Two processes on one file: one's batch is appended but not yet committed to the
    # index when the other checks the file on open. Its lines are not a crash's tail:
    # the check waits for the batch (the index's write lock) instead of cutting them off.
    path = tmp_path / "out.jsonl"
    writer = await open_sink(path)
    await writer.write_batch([{"id": 1}])
    appended, go_on = threading.Event(), threading.Event()
    append = writer._append

    def paused_append(payload: bytes) -> None:  # in the file, the index not committed
        append(payload)
        appended.set()
        go_on.wait(10)

    writer._append = paused_append  # type: ignore[method-assign]
    other = build_sink({"type": "jsonl", "path": str(path)})
    assert isinstance(other, JsonlSink)
    reached, check = threading.Event(), threading.Event()
    check_file = other._open

    def paused_open(db: sqlite3.Connection) -> None:  # its index open, the file unchecked
        reached.set()
        check.wait(10)
        check_file(db)

    other._open = paused_open  # type: ignore[method-assign]
    opening = asyncio.ensure_future(other.open())  # the other process starts
    assert await asyncio.to_thread(reached.wait, 10)
    batch = asyncio.ensure_future(writer.write_batch([{"id": 2}, {"id": 3}]))
    assert await asyncio.to_thread(appended.wait, 10)
    check.set()  # the other checks the file while the batch is in flight
    await asyncio.sleep(0.3)
    go_on.set()
    assert (await batch).inserted == 2
    await opening
    result = await other.write_batch([{"id": 3}, {"id": 4}])
    await writer.close()
    await other.close()
    assert (result.inserted, result.skipped) == (1, 1)
    assert [r["id"] for r in lines(path)] == [1, 2, 3, 4]
    again = await open_sink(path)  # the file and its index agree
    await again.close()


async def test_lost_index_is_rebuilt_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = await open_sink(path)
    await sink.write_batch([{"id": 1, "v": 1}, {"id": 2}])
    await sink.write_batch([{"id": 1, "v": 2}])
    await sink.close()
    sink.config.index_file.unlink()
    sink = await open_sink(path)
    result = await sink.write_batch([{"id": 1, "v": 2}, {"id": 2}])
    await sink.close()
    assert result.skipped == 2  # the last line of a key is its current version
    assert len(lines(path)) == 3


async def test_a_file_shorter_than_its_index_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = await open_sink(path)
    await sink.write_batch([{"id": 1}, {"id": 2}])
    await sink.close()
    os.truncate(path, 3)
    with pytest.raises(SinkError, match="Delete the index"):
        await open_sink(path)


LIST_ROW = {"id": 7, "title": "Rain"}
DETAIL_ROW = {"id": 7, "title": "Rain", "body": "It rained.", "record_kind": "detail"}


async def test_a_list_row_and_a_detail_row_of_one_id_are_written_once_each_across_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "out.jsonl"
    sink = await open_sink(path)
    first = [await sink.write_batch([row]) for row in (LIST_ROW, DETAIL_ROW)]
    await sink.close()
    for _ in range(2):  # a second run, then one whose index was lost
        sink = await open_sink(path)
        again = [await sink.write_batch([row]) for row in (LIST_ROW, DETAIL_ROW, LIST_ROW)]
        await sink.close()
        assert [r.skipped for r in again] == [1, 1, 1]
        sink.config.index_file.unlink()
    assert [r.inserted for r in first] == [1, 1]
    assert [line.get("record_kind") for line in lines(path)] == [None, "detail"]
    sink = await open_sink(path)
    changed = await sink.write_batch([{**DETAIL_ROW, "body": "It poured."}])
    await sink.close()
    assert changed.updated == 1  # a changed detail is a new version of the detail row only
    assert [line.get("body") for line in lines(path)] == [None, "It rained.", "It poured."]


async def test_an_index_from_before_record_kinds_is_rebuilt_from_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "out.jsonl"
    sink = await open_sink(path)
    await sink.write_batch([LIST_ROW])
    await sink.write_batch([DETAIL_ROW])
    await sink.close()
    with sqlite3.connect(sink.config.index_file) as db:  # the index as older versions kept it
        db.execute("DROP TABLE keyed")
        db.execute("CREATE TABLE entries (key TEXT PRIMARY KEY, hash TEXT NOT NULL)")
        db.execute("INSERT INTO entries VALUES ('7', 'hash-of-the-detail-row')")
    sink = await open_sink(path)
    again = await sink.write_batch([LIST_ROW])
    await sink.close()
    assert again.skipped == 1
    assert len(lines(path)) == 2


async def test_an_index_killed_before_its_first_commit_is_rebuilt_from_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "out.jsonl"
    sink = await open_sink(path)
    await sink.write_batch([LIST_ROW, {"id": 8}])
    await sink.close()
    sink.config.index_file.unlink()
    with sqlite3.connect(sink.config.index_file) as db:  # created, killed before it indexed
        db.execute("CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), size INTEGER"
                    " NOT NULL)")
    sink = await open_sink(path)
    again = await sink.write_batch([LIST_ROW, {"id": 8}])
    await sink.close()
    assert again.skipped == 2
    assert len(lines(path)) == 2


_WRITER = """
import asyncio, sys
from crawlhub.sinks.config import build_sink

async def main():
    sink = build_sink({"type": "jsonl", "path": sys.argv[1]})
    await sink.open()
    for start in range(0, 100_000, 50):
        ids = range(start, start + 50)
        await sink.write_batch([{"id": i, "title": f"t{i}"} for i in ids])
        await sink.write_batch([{"id": i, "title": f"t{i}", "body": "b" * 200,
                                 "record_kind": "detail"} for i in ids])

asyncio.run(main())
"""


@pytest.mark.parametrize("kill_at", [20_000, 60_000, 150_000])
async def test_a_writer_killed_with_sigkill_mid_batch_leaves_no_line_twice_or_lost(
        tmp_path: Path, kill_at: int) -> None:
    path = tmp_path / "out.jsonl"
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", _WRITER, str(path))
    try:
        await wait_for(lambda: path.exists() and path.stat().st_size >= kill_at,
                       f"{kill_at} bytes written")
    finally:
        child.kill()  # SIGKILL: wherever it is, between an append and its index commit too
        await child.wait()
    sink = await open_sink(path)  # cuts off a tail not committed
    written = {(row.get("record_kind", ""), row["id"]) for row in lines(path)}
    last = max(i for _, i in written)
    again = []
    for start in range(0, last + 1, 50):  # the resumed run writes everything again
        ids = range(start, start + 50)
        again.append(await sink.write_batch([{"id": i, "title": f"t{i}"} for i in ids]))
        again.append(await sink.write_batch([{"id": i, "title": f"t{i}", "body": "b" * 200,
                                              "record_kind": "detail"} for i in ids]))
    await sink.close()
    counts = Counter((row.get("record_kind", ""), row["id"]) for row in lines(path))
    assert set(counts.values()) == {1}
    top = (last // 50 + 1) * 50
    assert set(counts) == {(kind, i) for kind in ("", "detail") for i in range(top)}
    assert sum(r.skipped for r in again) == len(written)  # what was kept is not re-written

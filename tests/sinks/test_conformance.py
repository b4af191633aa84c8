"""One behaviour suite for every sink, each on its real server (see conftest.Backend).

Redelivery tests run on the sinks that dedupe themselves; Kafka leaves that to its
consumers (keyed messages), which test_kafka.py checks.
"""

from __future__ import annotations

import pytest

from crawlhub.core.errors import SinkError
from crawlhub.sinks.base import Sink
from tests.sinks.conftest import Backend

FETCHED = "2024-05-01T08:00:00+00:00"


def rec(i: int, **extra: object) -> dict[str, object]:
    return {"id": f"r{i}", "title": f"item {i}", "price": i * 10, **extra}


def by_id(rows: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {row["id"]: row for row in rows}


async def test_new_records_are_counted_as_inserted_and_stored(backend: Backend) -> None:
    sink = await backend.open()
    assert isinstance(sink, Sink)
    result = await sink.write_batch([rec(1), rec(2), rec(3)])
    assert (result.inserted, result.updated, result.skipped, result.failed) == (3, 0, 0, 0)
    stored = by_id(await backend.read())
    assert sorted(stored) == ["r1", "r2", "r3"]
    assert stored["r2"]["title"] == "item 2" and stored["r2"]["price"] == 20


async def test_redelivered_batch_adds_nothing_and_counts_skipped(deduping_backend: Backend) -> None:
    sink = await deduping_backend.open()
    batch = [rec(1), rec(2)]
    await sink.write_batch(batch)
    again = await sink.write_batch(batch)
    assert (again.inserted, again.updated, again.skipped) == (0, 0, 2)
    assert len(await deduping_backend.read()) == 2


async def test_redelivery_after_reopening_the_sink_adds_nothing(deduping_backend: Backend) -> None:
    first = await deduping_backend.open()
    await first.write_batch([rec(1)])
    await first.close()
    second = await deduping_backend.open()
    assert (await second.write_batch([rec(1)])).skipped == 1
    assert len(await deduping_backend.read()) == 1


async def test_changed_record_counts_as_updated(deduping_backend: Backend) -> None:
    sink = await deduping_backend.open()
    await sink.write_batch([rec(1), rec(2)])
    result = await sink.write_batch([rec(1, price=11), rec(2), rec(3)])
    assert (result.inserted, result.updated, result.skipped) == (1, 1, 1)
    latest = by_id(await deduping_backend.read())  # later lines/entries win
    assert latest["r1"]["price"] == 11


async def test_metadata_alone_changing_is_not_an_update(deduping_backend: Backend) -> None:
    sink = await deduping_backend.open()
    await sink.write_batch([rec(1, fetched_at=FETCHED)])
    again = await sink.write_batch([rec(1, fetched_at="2024-05-02T08:00:00+00:00")])
    assert again.skipped == 1


async def test_repeated_key_in_one_batch_keeps_the_last_record(backend: Backend) -> None:
    sink = await backend.open()
    result = await sink.write_batch([rec(1, price=1), rec(1, price=2)])
    assert (result.inserted, result.skipped) == (1, 1)
    stored = await backend.read()
    assert [row["price"] for row in stored] == [2]


async def test_batch_with_a_poison_record_is_rolled_back_whole(backend: Backend) -> None:
    sink = await backend.open()
    poison = rec(3, blob=object())  # no store can hold it
    with pytest.raises(SinkError, match="record 2"):
        await sink.write_batch([rec(1), rec(2), poison])
    assert await backend.read() == []
    assert (await sink.write_batch([rec(1)])).inserted == 1  # the sink goes on


async def test_record_without_its_key_fails_the_batch(backend: Backend) -> None:
    sink = await backend.open()
    with pytest.raises(SinkError, match="no key field 'id'"):
        await sink.write_batch([rec(1), {"title": "no id"}])
    assert await backend.read() == []


async def test_source_metadata_is_written_with_each_record(backend: Backend) -> None:
    sink = await backend.open()
    await sink.write_batch(
        [rec(1, source_endpoint="/api/items", fetched_at=FETCHED, source_file="page-1.json")]
    )
    [stored] = await backend.read()
    assert stored["source_endpoint"] == "/api/items"
    assert stored["fetched_at"] == FETCHED
    assert stored["source_file"] == "page-1.json"


async def test_composite_keys_identify_records(backend: Backend) -> None:
    sink = await backend.open(key=["shop", "id"])
    await sink.write_batch([{"shop": "a", "id": 1}, {"shop": "b", "id": 1}])
    assert len(await backend.read()) == 2

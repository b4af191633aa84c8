"""The charts' time series (``crawlhub.control.series``) on real SQLite and PostgreSQL:
samples roll up per minute (mean and newest), rows older than the retention go, what
was written is there after the store is opened again; the sampler writes an unchanged
counter once and keeps sampling when a source is out of reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlhub.control.db import ControlDB
from crawlhub.control.jobs import RunRecord
from crawlhub.control.sampler import Sampler, run_figures
from crawlhub.control.series import (
    MINUTE,
    PRUNE_EVERY,
    Point,
    Sample,
    SeriesStore,
    increases,
    minute_of,
)
from tests.helpers import FakeClock

T0 = minute_of(1_700_000_000)


async def test_samples_of_one_minute_roll_up_into_one_point_with_their_mean_and_newest(
        control_db: ControlDB) -> None:
    store = SeriesStore(control_db, clock=FakeClock(T0))
    await store.open()
    for offset, depth in ((0, 10), (15, 20), (45, 60)):
        await store.record([Sample("outbound", "default", "depth", depth)], at=T0 + offset)
    await store.record([Sample("outbound", "default", "depth", 7)], at=T0 + MINUTE)
    found = await store.read("outbound", since=T0, until=T0 + MINUTE)
    assert found == {("default", "depth"): [Point(T0, 30.0, 60.0, 3),
                                             Point(T0 + MINUTE, 7.0, 7.0, 1)]}
    assert await store.count() == 2


async def test_a_read_is_limited_to_its_window_subjects_and_metrics(
        control_db: ControlDB) -> None:
    store = SeriesStore(control_db, clock=FakeClock(T0))
    await store.open()
    for minute in range(5):
        await store.record([Sample("agent", "a1", "qps", minute),
                            Sample("agent", "a1", "memory", 100 + minute),
                            Sample("agent", "a2", "qps", 2 * minute),
                            Sample("outbound", "a1", "qps", 9)], at=T0 + minute * MINUTE)
    found = await store.read("agent", since=T0 + 2 * MINUTE, until=T0 + 3 * MINUTE,
                             subjects=["a1"], metrics=["qps"])
    assert found == {("a1", "qps"): [Point(T0 + 2 * MINUTE, 2.0, 2.0, 1),
                                     Point(T0 + 3 * MINUTE, 3.0, 3.0, 1)]}
    assert await store.read("agent", since=T0, subjects=[]) == {}


async def test_minutes_older_than_the_retention_are_pruned_so_the_store_stays_bounded(
        control_db: ControlDB) -> None:
    clock = FakeClock(T0)
    store = SeriesStore(control_db, retention=10 * MINUTE, clock=clock)
    await store.open()
    # two hours of one sample a minute for 3 series: never more than 11 minutes x 3 kept
    # once a prune is due
    for minute in range(120):
        clock.set(T0 + minute * MINUTE)
        await store.record([Sample("outbound", f"o{i}", "depth", minute) for i in range(3)])
        if minute * MINUTE % PRUNE_EVERY == 0:
            assert await store.count() <= 3 * (10 + PRUNE_EVERY // MINUTE + 1)
    await store.prune()
    assert await store.count() == 3 * 11
    kept = await store.read("outbound", since=T0, subjects=["o0"])
    assert [p.ts for p in kept[("o0", "depth")]] == [T0 + m * MINUTE for m in range(109, 120)]


async def test_what_was_written_is_read_back_after_the_store_is_opened_again(
        tmp_path: Path, control_db: ControlDB) -> None:
    store = SeriesStore(control_db, clock=FakeClock(T0))
    await store.open()
    await store.record([Sample("run", "r-1", "pages", 5, counter=True),
                        Sample("frontier", "news <b>", "admitted@3", 8, counter=True)], at=T0)
    url, prefix = control_db.url, control_db.prefix
    await control_db.close()
    again = await ControlDB.open(url, prefix=prefix)
    try:
        reopened = SeriesStore(again, clock=FakeClock(T0))
        await reopened.open()  # the schema exists: nothing is dropped
        assert (await reopened.read("run", since=T0))[("r-1", "pages")] == [
            Point(T0, 5.0, 5.0, 1)]
        assert (await reopened.read("frontier", since=T0, subjects=["news <b>"])) == {
            ("news <b>", "admitted@3"): [Point(T0, 8.0, 8.0, 1)]}
    finally:
        await again.close()
        await control_db.connect()  # the fixture drops its tables on this connection


def test_increases_read_a_counter_per_minute_and_from_zero_at_a_start() -> None:
    points = [Point(T0, 0, 5, 1), Point(T0 + 60, 0, 12, 1), Point(T0 + 180, 0, 12, 1),
              Point(T0 + 240, 0, 3, 1)]
    assert increases(points) == [(T0 + 60, 7), (T0 + 180, 0), (T0 + 240, 3)]
    assert increases(points, start=T0 + 5) == [(T0, 5), (T0 + 60, 7), (T0 + 180, 0),
                                               (T0 + 240, 3)]
    # a start long before the first point: the minutes between were pruned
    assert increases(points, start=T0 - 3600)[0] == (T0 + 60, 7)


async def test_the_sampler_writes_an_unchanged_counter_once_and_outlives_a_failing_source(
        tmp_path: Path) -> None:
    db = await ControlDB.open(f"sqlite:///{tmp_path}/control.db")
    clock = FakeClock(T0)
    store = SeriesStore(db, clock=clock)
    await store.open()
    pages = [3.0]

    async def runs() -> list[Sample]:
        return [Sample("run", "r-1", "pages", pages[0], counter=True)]

    async def away() -> list[Sample]:
        raise ConnectionError("redis://127.0.0.1:1 refused")

    sampler = Sampler(store, {"runs": runs, "agents": away}, clock=clock)
    try:
        assert await sampler.tick() == 1
        clock.advance(MINUTE)
        assert await sampler.tick() == 0  # unchanged: the gap reads as "no change"
        pages[0] = 9.0
        clock.advance(MINUTE)
        assert await sampler.tick() == 1
        found = (await store.read("run", since=T0))[("r-1", "pages")]
        assert increases(found, start=T0) == [(T0, 3.0), (T0 + 2 * MINUTE, 6.0)]
    finally:
        await db.close()


@pytest.mark.parametrize(("counters", "figures"), [
    ({"response_received_count": 40, "item_scraped_count": 30, "log_count/ERROR": 2,
      "finish_reason": "finished", "pages": 1},
     {"pages": 40.0, "items": 30.0, "errors": 2.0}),
    ({"success": 7, "total": 9}, {"pages": 7.0}),
    ({"requests_ok": 5, "items": 4, "requests_failed": True}, {"pages": 5.0, "items": 4.0}),
])
def test_a_runs_figures_come_from_scrapys_stats_first_then_the_usual_counters(
        counters: dict[str, object], figures: dict[str, float]) -> None:
    run = RunRecord(id="r", job="j", kind="subprocess", status="running", trigger="api",
                    started_at=T0, counters=counters)
    assert run_figures(run) == figures

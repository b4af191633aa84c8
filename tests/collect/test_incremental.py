"""Newest-first incremental collection against a real local API (seed 000, corrected)."""

from __future__ import annotations

from typing import Any

import pytest

from crawlhub.collect.build import new_run
from crawlhub.collect.store import SqlMetadataStore
from crawlhub.fetch.retry import RetryPolicy
from crawlhub.pipeline.result import Status
from tests.collect.conftest import LazyItems, ListSink, job_config, list_offsets
from tests.httpapi import ApiServer, Fault

FAST_RETRY = RetryPolicy(tries=2, backoff_base=0.001, jitter=0, error_field="code",
                         ok_values=(0,))


async def run_once(api: ApiServer, store: SqlMetadataStore, sink: ListSink, **over: Any):
    job = job_config(api.url, **over)
    run = new_run(job, store=store, sink=sink, retry=FAST_RETRY)
    return await run.run()


@pytest.mark.slow
async def test_seed_000_worked_examples_request_by_request(store: SqlMetadataStore) -> None:
    """Example 1: total 257449, batch 100, no progress; example 2: total 257600 next run."""
    items = LazyItems(257449, fresh_from=1049)  # offsets below 1049 are past filter_days
    sink = ListSink()
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        first = await run_once(api, store, sink)
        offsets = list_offsets(api)
        assert first.status is Status.SUCCEEDED
        assert offsets[0] == (0, 1)  # the total
        assert offsets[1:3] == [(257349, 100), (257249, 100)]
        # ... until three all-expired batches in a row stop the first run
        assert offsets[-4:] == [(1049, 100), (949, 100), (849, 100), (749, 100)]
        assert offsets[1:] == [(o, 100) for o in range(257349, 748, -100)]
        assert len(sink.rows) == 257449 - 1049
        progress = await store.load_progress("news")
        assert progress is not None
        assert (progress.start_offset, progress.last_total) == (257349, 257449)

        api.log.clear()
        items.total = 257600  # 151 new items an hour later
        second = await run_once(api, store, sink)
        assert second.status is Status.SUCCEEDED
        assert list_offsets(api) == [(0, 1), (257500, 100), (257400, 100)]
    assert all(i in sink.rows for i in range(257449, 257600))
    progress = await store.load_progress("news")
    assert progress is not None
    assert (progress.start_offset, progress.last_total, progress.run_id) == (257500, 257600, None)


async def test_total_below_batch_size_clamps_the_offset_at_zero(store: SqlMetadataStore) -> None:
    sink = ListSink()
    async with ApiServer(items=LazyItems(42)) as api:  # type: ignore[arg-type]
        result = await run_once(api, store, sink)
        offsets = list_offsets(api)
    assert offsets == [(0, 1), (0, 42)]
    assert sorted(sink.rows) == list(range(42))
    assert result.records_written == 42


async def test_the_oldest_partial_batch_is_read_with_a_clamped_offset(
    store: SqlMetadataStore,
) -> None:
    sink = ListSink()
    async with ApiServer(items=LazyItems(250)) as api:  # type: ignore[arg-type]
        await run_once(api, store, sink)
        offsets = list_offsets(api)
    assert offsets == [(0, 1), (150, 100), (50, 100), (0, 50)]
    assert sorted(sink.rows) == list(range(250))


async def test_filter_days_drops_old_items_but_later_runs_do_not_stop_on_expiry(
    store: SqlMetadataStore,
) -> None:
    items = LazyItems(1000, fresh_from=950)
    sink = ListSink()
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        await run_once(api, store, sink)
        assert sorted(sink.rows) == list(range(950, 1000))
        assert list_offsets(api) == [(0, 1), (900, 100), (800, 100), (700, 100), (600, 100)]
        api.log.clear()
        items.total = 1500
        items.fresh_from = 1000_000  # everything looks old now: no expiry stop on run 2
        await run_once(api, store, sink)
        assert list_offsets(api) == [(0, 1), (1400, 100), (1300, 100), (1200, 100),
                                     (1100, 100), (1000, 100)]
    assert sorted(sink.rows) == list(range(950, 1000))


async def test_items_added_between_runs_are_all_collected(store: SqlMetadataStore) -> None:
    items = LazyItems(1000)
    sink = ListSink()
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        for grow in (0, 1, 99, 100, 101, 250, 0, 37):
            items.total += grow
            result = await run_once(api, store, sink, strategy={"filter_days": None})
            assert result.status is Status.SUCCEEDED
            assert sorted(sink.rows) == list(range(items.total))


async def test_a_failed_batch_is_retried_by_the_next_run(store: SqlMetadataStore) -> None:
    items = LazyItems(500)
    sink = ListSink()
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        api.inject(Fault.http(503), times=2, when=lambda r: r.query.get("offset") == "200")
        first = await run_once(api, store, sink)
        assert first.requests_failed == 1
        assert sorted(sink.rows) == [i for i in range(500) if not 200 <= i < 300]
        api.log.clear()
        second = await run_once(api, store, sink)
        assert list_offsets(api) == [(0, 1), (200, 100)]
    assert second.status is Status.SUCCEEDED
    assert sorted(sink.rows) == list(range(500))


async def test_a_failed_write_keeps_the_batch_for_the_next_run(store: SqlMetadataStore) -> None:
    sink = ListSink()
    sink.fail_next = 1
    async with ApiServer(items=LazyItems(300)) as api:  # type: ignore[arg-type]
        first = await run_once(api, store, sink)
        assert first.batches_failed == 1
        assert sorted(sink.rows) == list(range(200))
        await run_once(api, store, sink)
    assert sorted(sink.rows) == list(range(300))


async def test_manual_stop_ends_cancelled_and_the_next_run_finishes_the_rest(
    store: SqlMetadataStore,
) -> None:
    items = LazyItems(1000)
    sink = ListSink()
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        job = job_config(api.url, strategy={"filter_days": None})
        run = new_run(job, store=store, sink=sink, retry=FAST_RETRY)
        # the 4th list request hangs until the token is cancelled
        api.inject(Fault.slow(30), when=lambda r: r.query.get("offset") == "600")
        import asyncio

        task = asyncio.create_task(run.run())
        await api.wait_for_requests(5)
        run.token.cancel("manual stop")
        result = await task
        assert result.status is Status.CANCELLED
        assert sorted(sink.rows) == list(range(700, 1000))
        progress = await store.load_progress("news")
        assert progress is not None and progress.saved_offset == 600
        api.clear_faults()
        api.log.clear()
        items.total = 1050
        again = await run_once(api, store, sink, strategy={"filter_days": None})
        assert list_offsets(api) == [(0, 1), (950, 100), (600, 100), (500, 100), (400, 100),
                                     (300, 100), (200, 100), (100, 100), (0, 100)]
    assert again.status is Status.SUCCEEDED
    assert sorted(sink.rows) == list(range(1050))


async def test_a_token_cancelled_before_start_sends_nothing(store: SqlMetadataStore) -> None:
    sink = ListSink()
    async with ApiServer(items=LazyItems(100)) as api:  # type: ignore[arg-type]
        run = new_run(job_config(api.url), store=store, sink=sink)
        run.token.cancel("before start")
        result = await run.run()
        assert api.log == []
    assert result.status is Status.CANCELLED
    assert await store.load_progress("news") is None

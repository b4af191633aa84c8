"""Cancelling a run never loses saved progress: not before the total answers, not while
the detail stage runs, not with SIGKILL (issue 7, items 15 and 16)."""

from __future__ import annotations

import asyncio
from typing import Any

from crawlhub.collect.build import new_run
from crawlhub.collect.store import SqlMetadataStore
from crawlhub.fetch.retry import RetryPolicy
from crawlhub.pipeline.result import Status
from tests.collect.conftest import LazyItems, ListSink, job_config, list_offsets
from tests.httpapi import ApiServer, Fault

FAST_RETRY = RetryPolicy(tries=2, backoff_base=0.001, jitter=0, error_field="code",
                         ok_values=(0,))


def is_total_probe(request: Any) -> bool:
    return request.path == "/items" and request.query.get("limit") == "1"


async def stopped_midway(api: ApiServer, store: SqlMetadataStore, sink: ListSink) -> None:
    """A first run stopped while offset 500 hangs: 900..600 delivered, 500 is next."""
    api.inject(Fault.slow(30), when=lambda r: r.query.get("offset") == "500")
    run = new_run(job_config(api.url), store=store, sink=sink, retry=FAST_RETRY)
    task = asyncio.create_task(run.run())
    await api.wait_for_requests(6)  # total, 900, 800, 700, 600, 500 (hangs)
    run.token.cancel("manual stop")
    assert (await task).status is Status.CANCELLED
    api.clear_faults()


async def test_a_stop_before_the_total_answers_keeps_the_saved_progress(
    store: SqlMetadataStore,
) -> None:
    sink = ListSink()
    async with ApiServer(items=LazyItems(1000)) as api:  # type: ignore[arg-type]
        await stopped_midway(api, store, sink)
        before = await store.load_progress("news")
        assert before is not None and before.saved_offset == 500

        api.inject(Fault.slow(30), when=is_total_probe)
        run = new_run(job_config(api.url), store=store, sink=sink, retry=FAST_RETRY)
        task = asyncio.create_task(run.run())
        await api.wait_for_requests(len(api.log) + 1)  # the total probe hangs
        run.token.cancel("manual stop")
        assert (await task).status is Status.CANCELLED
        after = await store.load_progress("news")
        assert after is not None
        assert (after.state, after.saved_offset, after.start_offset, after.last_total) == (
            before.state, before.saved_offset, before.start_offset, before.last_total)
        assert after.status == "CANCELLED" and after.run_id is None

        api.clear_faults()
        api.log.clear()
        third = await new_run(job_config(api.url), store=store, sink=sink,
                              retry=FAST_RETRY).run()
        offsets = list_offsets(api)
    assert third.status is Status.SUCCEEDED
    assert offsets == [(0, 1)] + [(o, 100) for o in range(500, -1, -100)]  # no re-read
    assert sorted(sink.rows) == list(range(1000))


async def test_a_failed_total_probe_keeps_the_saved_progress(store: SqlMetadataStore) -> None:
    sink = ListSink()
    async with ApiServer(items=LazyItems(1000)) as api:  # type: ignore[arg-type]
        await stopped_midway(api, store, sink)
        before = await store.load_progress("news")
        api.inject(Fault.http(503), times=None, when=is_total_probe)
        failed = await new_run(job_config(api.url), store=store, sink=sink,
                               retry=FAST_RETRY).run()
        after = await store.load_progress("news")
    assert failed.status is Status.FAILED
    assert before is not None and after is not None
    assert (after.state, after.saved_offset) == (before.state, before.saved_offset)

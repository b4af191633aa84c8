"""Window strategy (segments committed as units), full scans, and detail mode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from crawlhub.collect.build import new_run
from crawlhub.collect.store import SqlMetadataStore
from crawlhub.fetch.retry import RetryPolicy
from crawlhub.pipeline.result import Status
from tests.collect.conftest import LazyItems, ListSink, job_config, list_offsets
from tests.httpapi import ApiServer, Fault, make_items
from tests.servers import free_port

FAST_RETRY = RetryPolicy(tries=2, backoff_base=0.001, jitter=0, error_field="code",
                         ok_values=(0,))
T0 = datetime(2024, 5, 1, 0, 0).astimezone()


class EventsApi:
    """A real API of dated events: ``/events?from=&to=&offset=&limit=`` (ISO bounds).

    One event every 10 minutes from T0; ``fail`` holds request numbers to answer 503.
    """

    def __init__(self, hours: int = 5) -> None:
        self.events: list[dict[str, Any]] = [
            {"id": i, "at": (T0 + timedelta(minutes=10 * i)).isoformat()}
            for i in range(hours * 6)
        ]
        self.log: list[dict[str, str]] = []
        self.fail: set[int] = set()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        q = dict(request.query)
        self.log.append(q)
        if len(self.log) - 1 in self.fail:
            return web.json_response({"code": 503, "msg": "busy"}, status=503)
        lo, hi = datetime.fromisoformat(q["from"]), datetime.fromisoformat(q["to"])
        hits = [e for e in self.events if lo <= datetime.fromisoformat(str(e["at"])) < hi]
        off, lim = int(q.get("offset", 0)), int(q.get("limit", 1000))
        return web.json_response({"code": 0, "data": {"list": hits[off:off + lim],
                                                      "total": len(hits)}})


@pytest.fixture
async def events() -> AsyncIterator[EventsApi]:
    api = EventsApi()
    app = web.Application()
    app.router.add_get("/events", api.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    api.url = f"http://127.0.0.1:{port}"
    yield api
    await runner.cleanup()


def window_job(url: str) -> Any:
    return job_config(
        url, name="events",
        source={"url": f"{url}/events", "items_path": "data.list", "total_path": "data.total",
                "date_field": "at", "date_format": "iso",
                "pagination": {"type": "offset", "window": "3h", "segment": "1h"}},
        strategy={"type": "window", "batch_size": 4, "filter_days": None},
    )


async def test_window_segments_are_paged_forward_and_committed_one_transaction_each(
    events: EventsApi, store: SqlMetadataStore
) -> None:
    sink = ListSink()
    run = new_run(window_job(events.url), store=store, sink=sink, retry=FAST_RETRY,
                  now=lambda: T0 + timedelta(hours=3))
    result = await run.run()
    assert result.status is Status.SUCCEEDED
    assert sink.batches == [6, 6, 6]  # one write per 1h segment, whatever the page size
    assert sorted(sink.rows) == list(range(18))
    assert [(q["from"][11:16], q["offset"]) for q in events.log] == [
        ("00:00", "0"), ("00:00", "4"), ("01:00", "0"), ("01:00", "4"),
        ("02:00", "0"), ("02:00", "4")]
    assert await store.get_cursor("events", "window_end") == (T0 + timedelta(hours=3)).isoformat()


async def test_a_failure_mid_segment_drops_it_and_keeps_the_cursor_before_it(
    events: EventsApi, store: SqlMetadataStore
) -> None:
    sink = ListSink()
    events.fail = {3, 4}  # 2nd page of the 2nd segment fails both tries
    job = window_job(events.url)
    run = new_run(job, store=store, sink=sink, retry=FAST_RETRY,
                  now=lambda: T0 + timedelta(hours=3))
    result = await run.run()
    assert result.status is Status.FAILED
    assert sorted(sink.rows) == list(range(6))  # only the first segment, none of the 2nd
    assert await store.get_cursor("events", "window_end") == (T0 + timedelta(hours=1)).isoformat()
    events.log.clear()
    events.fail = set()
    again = await new_run(job, store=store, sink=sink, retry=FAST_RETRY,
                          now=lambda: T0 + timedelta(hours=3)).run()
    assert again.status is Status.SUCCEEDED
    assert events.log[0]["from"][11:16] == "01:00"
    assert sorted(sink.rows) == list(range(18))


async def test_full_scan_walks_forward_and_resumes_after_a_failed_page(
    store: SqlMetadataStore,
) -> None:
    sink = ListSink()
    async with ApiServer(items=LazyItems(350)) as api:  # type: ignore[arg-type]
        job = job_config(api.url, strategy={"type": "full", "filter_days": None})
        api.inject(Fault.http(503), times=2, when=lambda r: r.query.get("offset") == "200")
        first = await new_run(job, store=store, sink=sink, retry=FAST_RETRY).run()
        assert first.status is Status.FAILED
        assert list_offsets(api) == [(0, 100), (100, 100), (200, 100), (200, 100)]
        api.log.clear()
        second = await new_run(job, store=store, sink=sink, retry=FAST_RETRY).run()
        assert list_offsets(api) == [(200, 100), (300, 100)]
    assert second.status is Status.SUCCEEDED
    assert sorted(sink.rows) == list(range(350))


async def test_detail_mode_counts_ok_failed_and_skipped(store: SqlMetadataStore) -> None:
    sink = ListSink()
    items = make_items(30, newest=datetime.now().replace(microsecond=0))
    async with ApiServer(items=items) as api:
        job = job_config(api.url, name="deals", strategy={"batch_size": 10},
                         detail={"enabled": True, "url": f"{api.url}/items/{{id}}",
                                 "item_path": "item"})
        api.inject(Fault.http(503), times=None, when=lambda r: r.path in ("/items/7", "/items/9"))
        api.inject(Fault.http(404), times=None, when=lambda r: r.path == "/items/12")
        result = await new_run(job, store=store, sink=sink, retry=FAST_RETRY).run()
        detail_paths = [r.path for r in api.log if r.path.startswith("/items/")]
    assert result.status is Status.SUCCEEDED
    assert (result.detail_ok, result.detail_failed, result.detail_skipped) == (27, 3, 0)
    assert len(set(detail_paths)) == 30
    assert sum(1 for row in sink.rows.values() if row.get("detail")) == 27
    assert result.requests_ok == 4  # the total + 3 list batches


async def test_detail_ids_not_reached_after_a_stop_are_fetched_by_the_next_run(
    any_store: SqlMetadataStore,
) -> None:
    store = any_store
    sink = ListSink()
    items = make_items(20, newest=datetime.now().replace(microsecond=0))
    async with ApiServer(items=items) as api:
        job = job_config(api.url, name="deals", strategy={"batch_size": 10},
                         detail={"enabled": True, "url": f"{api.url}/items/{{id}}",
                                 "item_path": "item"})
        run = new_run(job, store=store, sink=sink, retry=FAST_RETRY)
        api.inject(Fault.slow(30), when=lambda r: r.path == "/items/15")
        import asyncio

        task = asyncio.create_task(run.run())
        while not any(r.path == "/items/15" for r in api.log):
            await api.wait_for_requests(len(api.log) + 1)
        run.token.cancel("manual stop")
        result = await task
        assert result.status is Status.CANCELLED
        assert result.detail_ok + result.detail_pending == 20
        assert result.detail_pending >= 1 and result.detail_skipped == 0
        pending = await store.detail_ids("deals")
        assert len(pending) == result.detail_pending and 15 in pending
        done_before = {r.path for r in api.log if r.path.startswith("/items/")} - {"/items/15"}

        api.clear_faults()
        api.log.clear()
        again = await new_run(job, store=store, sink=sink, retry=FAST_RETRY).run()
        fetched = [r.path for r in api.log if r.path.startswith("/items/")]
    assert again.status is Status.SUCCEEDED
    assert sorted(fetched) == sorted(f"/items/{i}" for i in pending)  # only those left
    assert not set(fetched) & done_before
    assert await store.detail_ids("deals") == []
    assert all(row.get("detail") for row in sink.rows.values())  # every id has its detail


async def test_detail_ids_whose_batch_was_rolled_back_stay_pending(
    store: SqlMetadataStore,
) -> None:
    sink, details = ListSink(), ListSink()
    details.fail_next = 1  # the first detail batch is rolled back
    items = make_items(10, newest=datetime.now().replace(microsecond=0))
    async with ApiServer(items=items) as api:
        job = job_config(api.url, name="deals", strategy={"batch_size": 10},
                         detail={"enabled": True, "url": f"{api.url}/items/{{id}}",
                                 "item_path": "item"})
        first = await new_run(job, store=store, sink=sink, detail_sink=details,
                              retry=FAST_RETRY).run()
        assert (first.detail_ok, first.detail_pending) == (10, 10)
        assert sorted(await store.detail_ids("deals")) == list(range(1, 11))
        second = await new_run(job, store=store, sink=sink, detail_sink=details,
                               retry=FAST_RETRY).run()
    assert (second.detail_ok, second.detail_pending) == (10, 0)
    assert sorted(details.rows) == list(range(1, 11))
    assert await store.detail_ids("deals") == []

"""The pipeline: pool with backpressure, single batching writer, cancel, failures, results."""

from __future__ import annotations

import asyncio
import io
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from rich.console import Console

from crawlhub.fetch import (
    CancellationToken,
    Fetcher,
    HttpClient,
    JobLog,
    Request,
    RequestScheduler,
    Response,
    RetryPolicy,
)
from crawlhub.pipeline import (
    BatchWriter,
    DetailMode,
    Pipeline,
    PipelineConfig,
    RunResult,
    Status,
    describe_progress,
    job_log,
    show_progress,
)
from crawlhub.sinks.config import build_sink
from tests.helpers import FakeClock, wait_for
from tests.httpapi import ApiServer, Fault
from tests.pipeline.sqlite_sink import SqliteSink


def config(**kw: Any) -> PipelineConfig:
    base: dict[str, Any] = {"rate_min": 0, "rate_max": 0, "batch_timeout": 30,
                            "progress_interval": 0}
    return PipelineConfig(**{**base, **kw})


def records(n: int, start: int = 1) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"r{i}"} for i in range(start, start + n)]


def passthrough(item: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(item)]


def page_items(response: Response) -> list[dict[str, Any]]:
    return list(response.json()["items"])


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    async with HttpClient(timeout=10) as c:
        yield c


def fetcher_for(client: HttpClient, job: str, token: CancellationToken | None = None,
                **kw: Any) -> Fetcher:
    scheduler = RequestScheduler(rate_min=0, rate_max=0, clock=FakeClock(),
                                 rng=random.Random(3))
    return Fetcher(client, scheduler, RetryPolicy.api_codes(backoff_base=0.0, jitter=0.0),
                   job_code=job, token=token, logger=JobLog(job), **kw)


def pages(api: ApiServer, size: int = 5) -> list[Request]:
    return [Request(f"{api.url}/items", params={"offset": o, "limit": size})
            for o in range(0, len(api.items), size)]


# ---- writer ---------------------------------------------------------------------------
async def test_records_are_written_in_batches_of_batch_size(sqlite_sink: SqliteSink) -> None:
    pipeline = Pipeline(passthrough, sqlite_sink, config(batch_size=4), job_code="batches",
                        logger=JobLog("batches"))
    await pipeline.start()
    for record in records(10):
        await pipeline.submit(record)
    result = await pipeline.finish()
    assert sqlite_sink.batches == [4, 4, 2]
    assert await sqlite_sink.ids() == [str(i) for i in range(1, 11)]
    assert (result.records_processed, result.records_written, result.batches_written) == (10, 10, 3)
    assert result.status is Status.SUCCEEDED


async def test_a_partial_batch_is_written_after_batch_timeout(sqlite_sink: SqliteSink) -> None:
    pipeline = Pipeline(passthrough, sqlite_sink, config(batch_size=100, batch_timeout=0.05),
                        job_code="timeout", logger=JobLog("timeout"))
    await pipeline.start()
    for record in records(3):
        await pipeline.submit(record)
    await asyncio.wait_for(sqlite_sink.batch_written.wait(), 10)  # before finish()
    assert sqlite_sink.batches == [3]
    assert await sqlite_sink.ids() == ["1", "2", "3"]
    await pipeline.finish()
    assert sqlite_sink.batches == [3]


async def test_a_failed_batch_is_rolled_back_counted_and_the_run_goes_on(
    sqlite_sink: SqliteSink,
) -> None:
    rows = records(9)
    rows[4]["name"] = None  # NOT NULL: the batch holding id 5 fails inside its transaction
    log = JobLog("rollback")
    pipeline = Pipeline(passthrough, sqlite_sink, config(batch_size=3, workers=1),
                        job_code="rollback", logger=log)
    await pipeline.start()
    for record in rows:
        await pipeline.submit(record)
    result = await pipeline.finish()
    assert await sqlite_sink.ids() == ["1", "2", "3", "7", "8", "9"]  # 4 and 6 rolled back too
    assert (result.batches_written, result.batches_failed) == (2, 1)
    assert (result.records_written, result.records_write_failed) == (6, 3)
    assert result.errors["write"][0]["batch_size"] == 3
    assert "NOT NULL" in result.errors["write"][0]["error"]
    assert result.status is Status.SUCCEEDED
    assert log.lines(event="batch failed, rolled back")[0]["size"] == 3


async def test_a_processing_error_is_counted_and_the_other_items_go_on(
    sqlite_sink: SqliteSink,
) -> None:
    def process(item: dict[str, Any]) -> list[dict[str, Any]]:
        if item["id"] == 3:
            raise KeyError("price")
        return [item]

    pipeline = Pipeline(process, sqlite_sink, config(), job_code="proc", logger=JobLog("proc"))
    await pipeline.start()
    for record in records(5):
        await pipeline.submit(record)
    result = await pipeline.finish()
    assert (result.records_processed, result.records_failed) == (4, 1)
    assert result.errors["process"] == [{"item": "id=3", "error": "KeyError: 'price'"}]
    assert await sqlite_sink.ids() == ["1", "2", "4", "5"]


async def test_records_queued_while_a_batch_is_written_follow_in_order(
    tmp_path: Any, unique_name: str
) -> None:
    gate = asyncio.Event()
    sink = SqliteSink(tmp_path / "held.db", table=unique_name, gate=gate)
    await sink.open()
    result = RunResult("held")
    writer = BatchWriter(sink, batch_size=100, batch_timeout=30, result=result,
                         log=JobLog("held"), backlog_limit=1000, id_field="id")
    writer.start()
    writer.put_many(records(150))
    for _ in range(10):
        await asyncio.sleep(0)  # the first batch is now held at the sink's gate
    assert sink.batches == [100]
    writer.put_many(records(120, 151))
    writer.put(records(1, 271)[0])
    assert writer.pending == 100 + 50 + 121
    gate.set()
    await writer.close()
    await sink.close()
    assert sink.batches == [100, 100, 71]
    assert writer.written_ids == list(range(1, 272))
    assert (result.records_written, result.batches_written) == (271, 3)


# ---- backpressure and backlog -------------------------------------------------------------
async def test_a_full_queue_makes_the_producer_wait_and_logs_a_warning(
    sqlite_sink: SqliteSink,
) -> None:
    gate = asyncio.Event()

    async def slow(item: dict[str, Any]) -> list[dict[str, Any]]:
        await gate.wait()
        return [item]

    log = JobLog("bp")
    pipeline = Pipeline(slow, sqlite_sink, config(workers=1, queue_size=2), job_code="bp",
                        logger=log)
    await pipeline.start()
    await pipeline.submit(records(1)[0])
    await asyncio.sleep(0)  # the worker takes item 1 and waits at the gate
    await pipeline.submit(records(1, 2)[0])
    await pipeline.submit(records(1, 3)[0])  # the queue is now full
    blocked = asyncio.create_task(pipeline.submit(records(1, 4)[0]))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not blocked.done()
    assert pipeline.progress()["queue"] == 2
    warnings = log.lines(event="processing queue full, scheduler waits (backpressure)")
    assert len(warnings) == 1 and warnings[0]["level"] == "warning"
    gate.set()
    await asyncio.wait_for(blocked, 5)
    result = await pipeline.finish()
    assert result.records_written == 4
    assert result.backpressure_waits == 1


async def test_a_write_backlog_above_twice_the_queue_size_logs_a_warning(
    tmp_path: Any, unique_name: str
) -> None:
    gate = asyncio.Event()
    sink = SqliteSink(tmp_path / "slow.db", table=unique_name, gate=gate)
    log = JobLog("backlog")
    pipeline = Pipeline(passthrough, sink, config(queue_size=2, batch_size=1),
                        job_code="backlog", logger=log)
    await pipeline.start()
    for record in records(10):
        await pipeline.submit(record)
    warning = await wait_for(lambda: log.lines(event="write backlog high"),
                             "the write backlog warning")
    assert warning and warning[0]["limit"] == 4 and warning[0]["pending"] > 4
    gate.set()
    result = await pipeline.finish()
    assert result.records_written == 10


# ---- whole runs against the local API -----------------------------------------------------
async def test_a_run_fetches_processes_and_writes_every_page(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    fetcher = fetcher_for(client, "run")
    pipeline = Pipeline(page_items, sqlite_sink, config(batch_size=7), job_code="run",
                        fetcher=fetcher)
    result = await pipeline.run(pages(api_server))
    assert result.status is Status.SUCCEEDED
    assert (result.requests_ok, result.requests_failed) == (5, 0)
    assert result.records_written == 25
    assert await sqlite_sink.ids() == [str(i) for i in range(1, 26)]
    assert sqlite_sink.opened == sqlite_sink.closed == 1


async def test_records_carry_source_endpoint_and_fetched_at(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    seen: list[dict[str, Any]] = []

    def keep(response: Response) -> list[dict[str, Any]]:
        out = page_items(response)
        seen.extend(out)
        return out

    pipeline = Pipeline(keep, sqlite_sink, config(), job_code="meta",
                        fetcher=fetcher_for(client, "meta"))
    await pipeline.run(pages(api_server)[:1])
    assert seen[0]["source_endpoint"] == "/items"
    assert seen[0]["fetched_at"].endswith("+00:00")


async def test_a_pre_cancelled_token_gives_an_empty_result_and_sends_nothing(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    token = CancellationToken()
    token.cancel("cancelled before start")
    pipeline = Pipeline(page_items, sqlite_sink, config(), token=token, job_code="pre",
                        fetcher=fetcher_for(client, "pre", token))
    result = await pipeline.run(pages(api_server))
    assert result.status is Status.CANCELLED
    assert result.reason == "cancelled before start"
    assert (result.requests_ok, result.records_processed, result.records_written) == (0, 0, 0)
    assert api_server.log == []
    assert sqlite_sink.opened == 0


async def test_cancel_during_a_run_writes_everything_processed_before_exit(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    api_server.add_items(75)  # 100 items, 20 pages
    token = CancellationToken()
    handled = 0

    def process(response: Response) -> list[dict[str, Any]]:  # runs in a worker thread
        nonlocal handled
        handled += 1
        if handled == 3:
            token.cancel("operator pressed stop")
        return page_items(response)

    pipeline = Pipeline(process, sqlite_sink, config(batch_size=1000), token=token,
                        job_code="cancel", fetcher=fetcher_for(client, "cancel", token))
    result = await pipeline.run(pages(api_server))
    assert result.status is Status.CANCELLED
    assert result.reason == "operator pressed stop"
    assert 3 <= result.requests_ok < 20
    assert result.records_written == result.records_processed == result.requests_ok * 5
    assert len(await sqlite_sink.ids()) == result.requests_ok * 5
    # nothing is sent after the cancel: at most the one request then in flight
    assert len(api_server.log) <= result.requests_ok + 1


async def test_a_token_timeout_ends_the_run_cancelled(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    api_server.inject(Fault.slow(30), path="/items", nth=2)
    token = CancellationToken(timeout=2.0)
    pipeline = Pipeline(page_items, sqlite_sink, config(), token=token, job_code="deadline",
                        fetcher=fetcher_for(client, "deadline", token))
    result = await asyncio.wait_for(pipeline.run(pages(api_server)), 10)
    assert result.status is Status.CANCELLED
    assert result.reason == "timeout after 2s"
    assert result.records_written == 10
    assert len(api_server.log) == 3


async def test_failed_requests_are_recorded_and_the_run_goes_on(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    api_server.inject(Fault.http(500), times=None, when=lambda r: r.query.get("offset") == "10")
    pipeline = Pipeline(page_items, sqlite_sink, config(), job_code="skip",
                        fetcher=fetcher_for(client, "skip"))
    result = await pipeline.run(pages(api_server))
    assert result.status is Status.SUCCEEDED
    assert (result.requests_ok, result.requests_failed, result.requests_retried) == (4, 1, 2)
    assert result.records_written == 20
    assert "HTTP 500" in result.errors["request"][0]["error"]


async def test_more_consecutive_failures_than_the_limit_end_the_run_failed(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    api_server.inject(Fault.http(503), times=None, when=lambda r: r.query.get("offset") != "0")
    fetcher = fetcher_for(client, "limit", max_consecutive_failures=2)
    fetcher.retry = RetryPolicy(tries=1)
    api_server.add_items(25)
    pipeline = Pipeline(page_items, sqlite_sink, config(), job_code="limit", fetcher=fetcher)
    result = await pipeline.run(pages(api_server))
    assert result.status is Status.FAILED
    assert "3 requests failed in a row" in (result.reason or "")
    assert (result.requests_ok, result.requests_failed) == (1, 3)
    assert len(api_server.log) == 4  # the run stopped; the other 6 pages were never asked
    assert result.records_written == 5  # what was fetched before is still written


# ---- detail mode ----------------------------------------------------------------------------
async def test_detail_mode_fetches_each_written_id_after_the_list(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink, tmp_path: Any,
    unique_name: str,
) -> None:
    api_server.items = api_server.items[:10]
    api_server.inject(Fault.http(500), times=None, path="/items/4")
    detail_sink = SqliteSink(tmp_path / "detail.db", table=unique_name + "_d")
    details = DetailMode(lambda i: Request(f"{api_server.url}/items/{i}"), item_path="item",
                         sink=detail_sink)
    pipeline = Pipeline(page_items, sqlite_sink, config(), job_code="detail",
                        fetcher=fetcher_for(client, "detail"))
    result = await pipeline.run(pages(api_server), details=details)
    paths = api_server.paths
    assert all(p.startswith("/items?") for p in paths[:2])
    assert all(p.startswith("/items/") for p in paths[2:])
    assert (result.detail_ok, result.detail_failed, result.detail_skipped) == (9, 1, 0)
    assert (result.requests_ok, result.requests_failed) == (2, 0)
    assert await detail_sink.ids() == [str(i) for i in range(1, 11) if i != 4]
    assert result.errors["detail"][0]["meta"] == {"id": 4}
    assert job_log("detail") is not None
    assert result.status is Status.SUCCEEDED
    assert detail_sink.opened == detail_sink.closed == 1


async def test_detail_mode_skips_empty_and_repeated_ids(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    details = DetailMode(lambda i: Request(f"{api_server.url}/items/{i}"), item_path="item",
                         ids=[1, 2, 2, None, "", 3])
    pipeline = Pipeline(page_items, sqlite_sink, config(), job_code="ids",
                        fetcher=fetcher_for(client, "ids"))
    result = await pipeline.run([], details=details)
    assert (result.detail_ok, result.detail_failed, result.detail_skipped) == (3, 0, 3)
    assert api_server.paths == ["/items/1", "/items/2", "/items/3"]


# ---- results, logs, progress ---------------------------------------------------------------
async def test_the_run_result_reports_counts_times_and_errors(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    api_server.inject(Fault.api_error(500, "busy"), times=1)
    pipeline = Pipeline(page_items, sqlite_sink, config(), job_code="report",
                        fetcher=fetcher_for(client, "report"))
    result = await pipeline.run(pages(api_server))
    data = result.to_dict()
    assert data["status"] == "SUCCEEDED"
    assert data["requests"] == {"ok": 5, "failed": 0, "retried": 1}
    assert data["records"] == {"processed": 25, "failed": 0, "written": 25, "skipped": 0,
                               "write_failed": 0}
    assert data["detail"] == {"ok": 0, "failed": 0, "skipped": 0, "pending": 0}
    for stage in ("total", "list", "request", "rate_wait", "process", "write"):
        assert stage in data["timings"]
    assert "report: SUCCEEDED; requests 5 ok / 0 failed" in result.summary()
    assert isinstance(result, RunResult)


async def test_each_job_keeps_its_own_log_buffer(
    api_server: ApiServer, client: HttpClient, tmp_path: Any, unique_name: str
) -> None:
    scheduler = RequestScheduler(rate_min=0, rate_max=0, clock=FakeClock())
    runs = []
    for job in (unique_name + "a", unique_name + "b"):
        fetcher = Fetcher(client, scheduler, job_code=job)  # logs to job_log(job)
        sink = SqliteSink(tmp_path / f"{job}.db", table=job)
        runs.append(Pipeline(page_items, sink, config(), job_code=job, fetcher=fetcher)
                    .run(pages(api_server)))
    await asyncio.gather(*runs)
    for job in (unique_name + "a", unique_name + "b"):
        lines = job_log(job).lines()
        assert {line["job"] for line in lines} == {job}
        assert len([line for line in lines if line["event"] == "request"]) == 5
        assert lines[-1]["event"] == "run finished"
    assert api_server.max_in_flight == 1


async def test_progress_reports_queues_workers_and_requests(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    snapshots: list[dict[str, Any]] = []
    pipeline: Pipeline

    def process(response: Response) -> list[dict[str, Any]]:
        return page_items(response)

    pipeline = Pipeline(process, sqlite_sink, config(workers=3), job_code="prog",
                        fetcher=fetcher_for(client, "prog"))
    console = Console(file=io.StringIO(), width=200, force_terminal=False)

    def snap() -> list[dict[str, Any]]:
        snapshots.append(pipeline.progress())
        return [snapshots[-1]]

    result = await show_progress(snap, pipeline.run(pages(api_server)), console=console,
                                 interval=0.01)
    last = pipeline.progress()
    assert result.status is Status.SUCCEEDED
    assert last["requests_done"] == last["requests_total"] == 5
    assert {"queue", "queue_size", "active_workers", "workers", "write_backlog",
            "requests_waiting"} <= set(last)
    assert last["workers"] == 3 and last["written"] == 25
    assert "[prog] done 5/5 requests" in describe_progress(last)
    assert "prog" in console.file.getvalue()  # type: ignore[attr-defined]


async def test_progress_is_logged_while_running(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    api_server.inject(Fault.slow(0.5), nth=0)
    log = JobLog("plog")
    pipeline = Pipeline(page_items, sqlite_sink, config(progress_interval=0.05),
                        job_code="plog", logger=log, fetcher=fetcher_for(client, "plog"))
    await pipeline.run(pages(api_server)[:2])
    line = log.lines(event="progress")[0]
    assert line["job"] == "plog"
    assert {"queue", "active_workers", "write_backlog", "requests_done"} <= set(line)


def test_bad_pool_sizes_are_value_errors_naming_key_and_value() -> None:
    with pytest.raises(ValueError, match=r"pipeline\.workers.*value 0"):
        PipelineConfig(workers=0)
    with pytest.raises(ValueError, match=r"pipeline\.queue_size.*value 0"):
        PipelineConfig(queue_size=0)
    with pytest.raises(ValueError, match=r"pipeline\.batch_size.*value -5"):
        PipelineConfig(batch_size=-5)


async def test_cancel_from_another_thread_is_honoured(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    api_server.inject(Fault.slow(30), nth=1)
    token = CancellationToken()
    pipeline = Pipeline(page_items, sqlite_sink, config(), token=token, job_code="thread",
                        fetcher=fetcher_for(client, "thread", token))
    run = asyncio.create_task(pipeline.run(pages(api_server)))
    await api_server.wait_for_requests(2)
    threading.Thread(target=token.cancel, args=("API: cancel job",)).start()
    result = await asyncio.wait_for(run, 10)
    assert result.status is Status.CANCELLED
    assert result.records_written == 5


# ---- full snapshots ---------------------------------------------------------------------
@pytest.mark.parametrize("ending", ["cancelled", "failed", "succeeded"])
async def test_only_a_complete_full_snapshot_run_marks_unseen_rows_deleted(
    postgres_url: str, unique_name: str, ending: str
) -> None:
    spec = {"type": "postgres", "url": postgres_url, "table": unique_name, "full_snapshot": True}
    first = build_sink(spec)
    await first.open()
    await first.write_batch(records(5))
    await first.close()  # a complete snapshot of ids 1-5

    token = CancellationToken()
    pipeline = Pipeline(passthrough, build_sink(spec), config(), token=token,
                        job_code="snap", logger=JobLog("snap"))
    await pipeline.start()
    for record in records(2):
        await pipeline.submit(record)
    if ending == "cancelled":
        token.cancel("operator pressed stop")
    elif ending == "failed":
        pipeline.fail("too many failures")
    result = await pipeline.finish()

    conn = await asyncpg.connect(postgres_url)
    try:
        live = await conn.fetch(
            f'SELECT id FROM "{unique_name}" WHERE deleted_at IS NULL ORDER BY id'
        )
    finally:
        await conn.execute(f'DROP TABLE "{unique_name}"')
        await conn.close()
    assert result.status is Status(ending.upper())
    assert result.records_skipped == 2  # unchanged, but seen by this snapshot
    expected = ["1", "2"] if ending == "succeeded" else ["1", "2", "3", "4", "5"]
    assert [r["id"] for r in live] == expected


# ---- barriers and segments (one window segment = one transaction) ---------------------------
async def test_flush_writes_everything_submitted_so_far(sqlite_sink: SqliteSink) -> None:
    pipeline = Pipeline(passthrough, sqlite_sink, config(batch_size=100), job_code="flush",
                        logger=JobLog("flush"))
    await pipeline.start()
    for record in records(3):
        await pipeline.submit(record)
    assert await pipeline.flush() is True
    assert await sqlite_sink.ids() == ["1", "2", "3"]
    await pipeline.finish()
    assert sqlite_sink.batches == [3]


async def test_an_atomic_batch_is_written_as_one_batch_whatever_the_batch_size(
    sqlite_sink: SqliteSink,
) -> None:
    pipeline = Pipeline(passthrough, sqlite_sink, config(batch_size=2), job_code="seg",
                        logger=JobLog("seg"))
    await pipeline.start()
    await pipeline.submit(records(1, 100)[0])
    async with pipeline.atomic_batch("2024-05-01") as batch:
        for record in records(5):
            await pipeline.submit(record)
    assert batch.written and batch.records == 5
    result = await pipeline.finish()
    assert sqlite_sink.batches == [1, 5]
    assert result.records_written == 6


async def test_an_atomic_batch_that_raises_is_dropped_unwritten(sqlite_sink: SqliteSink) -> None:
    pipeline = Pipeline(passthrough, sqlite_sink, config(batch_size=2), job_code="segfail",
                        logger=JobLog("segfail"))
    await pipeline.start()
    with pytest.raises(RuntimeError, match="page 3 failed"):
        async with pipeline.atomic_batch("2024-05-02"):
            for record in records(3):
                await pipeline.submit(record)
            raise RuntimeError("page 3 failed")
    async with pipeline.atomic_batch("2024-05-03"):
        await pipeline.submit(records(1, 7)[0])
    result = await pipeline.finish()
    assert await sqlite_sink.ids() == ["7"]
    assert (result.records_written, result.records_write_failed) == (1, 3)


async def test_an_atomic_batch_whose_transaction_fails_is_rolled_back_whole(
    sqlite_sink: SqliteSink,
) -> None:
    rows = records(4)
    rows[3]["name"] = None
    pipeline = Pipeline(passthrough, sqlite_sink, config(batch_size=2), job_code="segrb",
                        logger=JobLog("segrb"))
    await pipeline.start()
    async with pipeline.atomic_batch("2024-05-04") as batch:
        for record in rows:
            await pipeline.submit(record)
    result = await pipeline.finish()
    assert batch.written is False
    assert await sqlite_sink.ids() == []
    assert (result.batches_failed, result.records_write_failed) == (1, 4)


async def test_requests_may_come_from_an_async_generator(
    api_server: ApiServer, client: HttpClient, sqlite_sink: SqliteSink
) -> None:
    async def walk() -> AsyncIterator[Request]:
        for request in pages(api_server):
            yield request

    pipeline = Pipeline(page_items, sqlite_sink, config(), job_code="agen",
                        fetcher=fetcher_for(client, "agen"))
    result = await pipeline.run(walk())
    assert (result.requests_ok, result.records_written) == (5, 25)
    assert pipeline.progress()["requests_total"] is None

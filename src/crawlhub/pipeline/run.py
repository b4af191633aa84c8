"""One job's run: fetched responses -> processing pool -> single writer -> sink, then details.

``Pipeline`` wires the pool and the writer to a token and a fetcher, keeps the live
``RunResult`` and the progress snapshot, and decides the final status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from crawlhub.core.errors import CancelledError, FetchError
from crawlhub.fetch.cancel import CancellationToken
from crawlhub.fetch.fetcher import Fetcher
from crawlhub.fetch.http import Request, Response
from crawlhub.fetch.joblog import JobLog, job_log
from crawlhub.fetch.retry import TooManyFailures
from crawlhub.pipeline.config import PipelineConfig
from crawlhub.pipeline.pool import Process, ProcessingPool
from crawlhub.pipeline.result import RunResult, Status
from crawlhub.pipeline.writer import BatchWriter
from crawlhub.sinks.base import Sink, SnapshotSink


@dataclass
class DetailMode:
    """Fetch each listed item again from a detail endpoint, after the list is written.

    - ``request(id) -> Request`` builds the detail request (through the same scheduler);
    - ids come from the records the list stage wrote (``id_field``), or from ``ids``;
    - ``process(response)`` turns a detail response into records; by default the JSON
      body's ``item_path`` (dotted; None = the whole body) is the record;
    - records go to ``sink`` (default: the list's sink).

    A failing id is logged with its error and skipped; empty and repeated ids are skipped.

    ``done(ids)``, when given, is awaited with ids that are settled (their records written,
    or failed / skipped for good), every ``checkpoint_every`` ids and at the end: the
    caller keeps the other ids for a later run. Ids not reached after a stop are then
    counted as ``detail_pending``, not skipped.
    """

    request: Callable[[Any], Request]
    process: Process | None = None
    item_path: str | None = None
    sink: Sink | None = None
    id_field: str = "id"
    ids: Iterable[Any] | None = None
    done: Callable[[list[Any]], Awaitable[None]] | None = None
    checkpoint_every: int = 100

    def default_process(self, response: Response) -> list[dict[str, Any]]:
        body: Any = response.json()
        for part in (self.item_path or "").split("."):
            if part and isinstance(body, dict):
                body = body.get(part)
        return [body] if isinstance(body, dict) else []


@dataclass
class AtomicBatch:
    """What a ``Pipeline.atomic_batch`` block wrote: one batch, committed or not."""

    name: str
    written: bool = False
    records: int = 0  # records processed inside the block
    failed: int = 0  # items whose processing failed inside the block


class Pipeline:
    """Processing pool plus one batching writer for one job, driven by ``submit``.

    Lifecycle: ``await start()``; ``await submit(item)`` per fetched response (waits while
    the pool's queue is full); ``await finish()`` processes and writes everything queued
    and returns the ``RunResult``. ``run(requests)`` does all of it with ``fetcher``.

    A token cancelled before ``start`` gives an empty CANCELLED result: the sink is not
    opened and nothing is sent. A token cancelled later stops fetching; everything
    already fetched is still processed and written before ``finish`` returns. A run that
    ends CANCELLED or FAILED abandons the sink's snapshot (``SnapshotSink``), so rows it
    did not reach are not marked deleted.
    """

    def __init__(
        self,
        process: Process,
        sink: Sink,
        config: PipelineConfig | None = None,
        token: CancellationToken | None = None,
        job_code: str = "job",
        logger: JobLog | None = None,
        *,
        fetcher: Fetcher | None = None,
        own_sink: bool = True,
        add_metadata: bool = True,
        id_field: str | None = None,
    ) -> None:
        self.process = process
        self.sink = sink
        self.config = config or PipelineConfig()
        self.token = token or (fetcher.token if fetcher is not None else CancellationToken())
        self.job_code = job_code
        self.log = logger or (fetcher.log if fetcher is not None else job_log(job_code))
        self.fetcher = fetcher
        self.own_sink = own_sink
        self.add_metadata = add_metadata
        self.result = RunResult(job_code)
        self.stage = "idle"
        self.requests_total: int | None = None
        self._id_field = id_field
        self._writer: BatchWriter | None = None
        self._pool: ProcessingPool | None = None
        self._sink_open = False
        self._started = False
        self._finished = False
        self._began = 0.0
        self._failure: str | None = None
        self._progress_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Pipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._finished:
            await self.finish()

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Open the sink and start the workers and the writer (not when pre-cancelled)."""
        if self._started:
            return
        self._started = True
        self._began = time.monotonic()
        self.result.started_at = time.time()
        if self.token.is_cancelled:
            self.log.warning("cancelled before start, nothing sent", reason=self.token.reason)
            return
        if self.own_sink:
            await self.sink.open()
            self._sink_open = True
        self._start_stage("list", self.sink, self.process)
        self.log.info("pipeline started", workers=self.config.workers,
                      queue_size=self.config.queue_size, batch_size=self.config.batch_size,
                      batch_timeout=self.config.batch_timeout, sink=self.sink.name)
        if self.config.progress_interval > 0:
            self._progress_task = asyncio.create_task(self._log_progress())

    def _start_stage(self, stage: str, sink: Sink, process: Process) -> None:
        self.stage = stage
        self._writer = BatchWriter(
            sink,
            batch_size=self.config.batch_size,
            batch_timeout=self.config.batch_timeout,
            result=self.result,
            log=self.log,
            backlog_limit=self.config.queue_size * 2,
            id_field=self._id_field,
        )
        self._pool = ProcessingPool(
            process,
            workers=self.config.workers,
            queue_size=self.config.queue_size,
            writer=self._writer,
            result=self.result,
            log=self.log,
            add_metadata=self.add_metadata,
            # a detail row and the list row of one id are two records, not two versions
            record_kind="detail" if stage == "detail" else None,
        )
        self._writer.start()
        self._pool.start()

    async def _drain(self) -> None:
        """Process everything queued, write everything processed, stop both."""
        if self._pool is not None:
            await self._pool.close()
        if self._writer is not None:
            await self._writer.close()

    async def submit(self, item: Any) -> None:
        """Hand a fetched response (or any item ``process`` takes) to the pool."""
        if not self._started:
            raise RuntimeError("Pipeline.submit() before start(): call await pipeline.start()")
        if self._finished:
            raise RuntimeError("Pipeline.submit() after finish()")
        if self._pool is None:  # cancelled before start
            raise CancelledError(f"cancelled: {self.token.reason}")
        await self._pool.submit(item)

    async def flush(self) -> bool:
        """A barrier: everything submitted so far is processed and written now.

        True when every batch written since the previous flush went in.
        """
        if self._pool is None or self._writer is None:
            return True
        failed_before = self.result.batches_failed
        await self._pool.join()
        ok = await self._writer.flush()
        return ok and self.result.batches_failed == failed_before

    @asynccontextmanager
    async def atomic_batch(self, name: str) -> AsyncIterator[AtomicBatch]:
        """Items submitted inside the block are written as ONE batch (one transaction).

        For sources walked in time windows (a collection job's window segments) that must
        commit as a unit: at the end of the block its records go to the sink together,
        whatever ``batch_size`` says; if the block raises, they are dropped unwritten
        (counted as write failures) and the error propagates. ``AtomicBatch.written``
        tells the outcome.
        """
        if self._pool is None or self._writer is None:
            raise CancelledError(f"cancelled: {self.token.reason}")
        await self.flush()  # what came before is not part of this batch
        outcome = AtomicBatch(name)
        processed, failed = self.result.records_processed, self.result.records_failed
        self._writer.hold = True
        try:
            yield outcome
        except BaseException:
            await self._pool.join()
            await self._writer.flush(drop=True)
            raise
        else:
            await self._pool.join()
            outcome.written = await self._writer.flush()
        finally:
            self._writer.hold = False
            outcome.records = self.result.records_processed - processed
            outcome.failed = self.result.records_failed - failed
            self.log.info("segment done", segment=name, written=outcome.written,
                          records=outcome.records, failed=outcome.failed)

    def fail(self, reason: str) -> None:
        """End the run as FAILED (already processed records are still written)."""
        if self._failure is None:
            self._failure = reason
            self.log.error("run failing", reason=reason)

    def set_total(self, total: int | None) -> None:
        """How many requests the run expects (for progress)."""
        self.requests_total = total

    async def finish(self) -> RunResult:
        """Drain pool and writer, close the sink, and return the final result."""
        if self._finished:
            return self.result
        if not self._started:
            await self.start()
        self._finished = True
        drained = False
        try:
            await self._drain()
            drained = True
        finally:
            if self._progress_task is not None:
                self._progress_task.cancel()
                self._progress_task = None
            if self._sink_open:
                self._sink_open = False
                await self._close_sink(self.sink, complete=drained and self._can_go_on())
        return self._conclude()

    async def _close_sink(self, sink: Sink, *, complete: bool) -> None:
        """Close a sink; a run that did not complete first abandons the sink's snapshot,
        so a partial snapshot marks nothing deleted."""
        if not complete and isinstance(sink, SnapshotSink):
            await sink.abandon_snapshot()
            self.log.warning("run incomplete, snapshot abandoned: nothing marked deleted",
                             sink=sink.name, reason=self.token.reason or self._failure)
        await sink.close()

    def _conclude(self) -> RunResult:
        result = self.result
        if self.fetcher is not None:
            listed = self.fetcher.stage("list")
            detail = self.fetcher.stage("detail")
            result.requests_ok, result.requests_failed = listed.ok, listed.failed
            result.requests_retried = listed.retries + detail.retries
            result.detail_ok, result.detail_failed = detail.ok, detail.failed
            for stage, stats in (("request", listed), ("detail", detail)):
                result.errors[stage] = list(stats.errors)
            result.timings["request"] = listed.request_time + detail.request_time
            result.timings["rate_wait"] = listed.wait_time + detail.wait_time
            result.timings["backoff"] = listed.backoff_time + detail.backoff_time
            if self.fetcher.tripped is not None and self._failure is None:
                self._failure = str(self.fetcher.tripped)
        if self._failure is not None:
            result.status, result.reason = Status.FAILED, self._failure
        elif self.token.is_cancelled:
            result.status, result.reason = Status.CANCELLED, self.token.reason
        else:
            result.status = Status.SUCCEEDED
        result.finished_at = time.time()
        result.timings["total"] = time.monotonic() - self._began
        self.stage = "done"
        self.log.info("run finished", status=result.status.value, summary=result.summary(),
                      timings={k: round(v, 3) for k, v in result.timings.items()})
        return result

    # ---- the whole run ----------------------------------------------------------------
    async def run(
        self,
        requests: Iterable[Request] | AsyncIterable[Request],
        *,
        details: DetailMode | None = None,
        total: int | None = None,
    ) -> RunResult:
        """Fetch ``requests`` in order, process and write them, then the detail stage.

        A request that fails after its tries is recorded and skipped; more than
        ``max_consecutive_failures`` in a row end the run FAILED; a cancel ends it
        CANCELLED. Either way, what was fetched is processed and written first.
        """
        fetcher = self._need_fetcher()
        if details is not None and details.ids is None and self._id_field is None:
            self._id_field = details.id_field
        if total is None and isinstance(requests, list | tuple):
            total = len(requests)
        self.set_total(total)
        await self.start()
        if self._pool is None:  # cancelled before start: nothing is sent
            return await self.finish()
        began = time.monotonic()
        try:
            if isinstance(requests, AsyncIterable):
                async for req in requests:
                    if not await self._fetch_one(fetcher, req, "list"):
                        break
            else:
                for req in requests:
                    if not await self._fetch_one(fetcher, req, "list"):
                        break
            await self._drain()
        finally:
            self.result.add_time("list", time.monotonic() - began)
        if details is not None and self._can_go_on():
            await self._run_details(fetcher, details)
        return await self.finish()

    def _need_fetcher(self) -> Fetcher:
        if self.fetcher is None:
            raise RuntimeError(
                f"Pipeline.run() for job {self.job_code} needs a fetcher: "
                "Pipeline(..., fetcher=Fetcher(client, scheduler, job_code=...))"
            )
        return self.fetcher

    def _can_go_on(self) -> bool:
        return (
            not self.token.is_cancelled
            and self._failure is None
            and (self.fetcher is None or self.fetcher.tripped is None)
        )

    async def _fetch_one(self, fetcher: Fetcher, req: Request, stage: str) -> bool:
        """Fetch and submit one request; False when the run must stop."""
        if not self._can_go_on():
            return False
        try:
            response = await fetcher.fetch(req, stage=stage)
        except CancelledError:
            return False
        except TooManyFailures as exc:
            self.fail(str(exc))
            return False
        except FetchError:
            return True  # recorded by the fetcher; the next request goes on
        await self.submit(response)
        return True

    async def _run_details(self, fetcher: Fetcher, details: DetailMode) -> None:
        ids = list(details.ids) if details.ids is not None else (
            list(self._writer.written_ids) if self._writer is not None else [])
        sink = details.sink or self.sink
        opened = False
        if details.sink is not None and details.sink is not self.sink:
            await sink.open()
            opened = True
        self.log.info("detail stage started", ids=len(ids), sink=sink.name)
        self._start_stage("detail", sink, details.process or details.default_process)
        seen: set[Any] = set()
        began = time.monotonic()
        drained = False
        keep = details.done is not None  # ids not settled stay the caller's (pending)
        chunk: list[Any] = []  # settled ids since the last checkpoint
        failed_before = self.result.batches_failed

        async def checkpoint(written: bool) -> None:
            nonlocal failed_before
            if chunk and details.done is not None:
                if written and self.result.batches_failed == failed_before:
                    await details.done(list(chunk))
                else:  # a batch was rolled back: these ids stay pending
                    self.result.detail_pending += len(chunk)
                    self.log.warning("detail batch not written, ids kept for the next run",
                                     ids=len(chunk))
            chunk.clear()
            failed_before = self.result.batches_failed

        try:
            for n, item_id in enumerate(ids):
                if not self._can_go_on():
                    if keep:
                        self.result.detail_pending += len(ids) - n
                    else:
                        self.result.detail_skipped += len(ids) - n
                    self.log.warning("detail stage stopped", left=len(ids) - n, kept=keep,
                                     reason=self.token.reason or self._failure)
                    break
                key = repr(item_id)
                if item_id is None or item_id == "" or key in seen:
                    self.result.detail_skipped += 1
                    chunk.append(item_id)
                    continue
                seen.add(key)
                req = details.request(item_id)
                req.meta.setdefault("id", item_id)
                try:
                    response = await fetcher.fetch(req, stage="detail")
                except CancelledError:
                    if keep:
                        self.result.detail_pending += len(ids) - n
                    else:
                        self.result.detail_skipped += len(ids) - n
                    break
                except TooManyFailures as exc:
                    self.fail(str(exc))
                    if keep:
                        self.result.detail_pending += len(ids) - n
                    else:
                        self.result.detail_skipped += len(ids) - n - 1
                    break
                except FetchError as exc:
                    self.log.error("detail failed, skipped", id=item_id, error=str(exc))
                    chunk.append(item_id)
                    continue
                await self.submit(response)
                chunk.append(item_id)
                if keep and len(chunk) >= max(1, details.checkpoint_every):
                    await checkpoint(await self.flush())
            await self._drain()
            drained = True
            await checkpoint(True)
        finally:
            self.result.add_time("detail", time.monotonic() - began)
            if opened:
                await self._close_sink(sink, complete=drained and self._can_go_on())

    # ---- observation ------------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        """A snapshot for logs and progress bars: queues, workers, requests done/total."""
        done = 0
        waiting = 0
        if self.fetcher is not None:
            done = self.fetcher.stage("list").done + self.fetcher.stage("detail").done
            waiting = self.fetcher.scheduler.waiting
        return {
            "job": self.job_code,
            "stage": self.stage,
            "requests_done": done,
            "requests_total": self.requests_total,
            "requests_waiting": waiting,
            "queue": self._pool.depth if self._pool is not None else 0,
            "queue_size": self.config.queue_size,
            "active_workers": self._pool.active if self._pool is not None else 0,
            "workers": self.config.workers,
            "write_backlog": self._writer.pending if self._writer is not None else 0,
            "processed": self.result.records_processed,
            "written": self.result.records_written,
            "failed": self.result.records_failed + self.result.records_write_failed,
            "elapsed": round(time.monotonic() - self._began, 3) if self._started else 0.0,
        }

    async def _log_progress(self) -> None:
        while True:
            await asyncio.sleep(self.config.progress_interval)
            self.log.info("progress", **self.progress())

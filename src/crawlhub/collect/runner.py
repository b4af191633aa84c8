"""One run of a collection job: walk the source by its strategy, deliver, save progress.

Requests go through the job's ``Fetcher`` (scheduler, retries, token); every unit (an
incremental batch, a forward page, a time segment) goes through the processing pool and
the single writer and is written before the next request and before progress is saved.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from crawlhub.collect.plan import (
    IncrementalState,
    Sweep,
    forward_done,
    forward_pages,
    plan_incremental,
    window_segments,
)
from crawlhub.collect.source import (
    Page,
    SourceError,
    detail_request,
    get_path,
    is_fresh,
    item_date,
    item_id,
    list_request,
    read_page,
)
from crawlhub.collect.store.base import MetadataStore, Progress, RunRecord
from crawlhub.config.jobs import JobConfig
from crawlhub.config.pipeline import PipelineConfig
from crawlhub.errors import CancelledError, FetchError
from crawlhub.fetch.fetcher import Fetcher
from crawlhub.fetch.http import Request, Response
from crawlhub.fetch.joblog import JobLog
from crawlhub.fetch.retry import TooManyFailures
from crawlhub.pipeline.pool import ProcessingPool
from crawlhub.pipeline.result import RunResult, Status
from crawlhub.pipeline.writer import BatchWriter
from crawlhub.sinks.base import Sink

#: Cursor names in the metadata store.
WINDOW_CURSOR = "window_end"
FULL_CURSOR = "full_offset"


def _now() -> datetime:
    return datetime.now().astimezone()


@dataclass
class _Unit:
    """What one delivered unit held: items read, fresh (kept) ones, whether it parsed."""

    items: int = 0
    fresh: int = 0
    parsed: bool = False
    total: int | None = None
    written_ok: bool = True


class _Stop(Exception):
    """The list stage ends here (cancelled, or too many failures): progress stays put."""


class JobRun:
    """Runs ``job`` once: ``result = await JobRun(job, ...).run()``.

    The caller owns the fetcher (its scheduler may be shared) and the store; the run
    opens and closes the sinks. ``progress()`` is a live snapshot for logs and bars.
    """

    def __init__(
        self,
        job: JobConfig,
        *,
        store: MetadataStore,
        fetcher: Fetcher,
        sink: Sink,
        pipeline: PipelineConfig | None = None,
        detail_sink: Sink | None = None,
        log: JobLog | None = None,
        now: Callable[[], datetime] = _now,
        run_id: str | None = None,
        closers: list[Callable[[], Awaitable[None]]] | None = None,
    ) -> None:
        self.job = job
        self.closers = list(closers or [])
        self.store = store
        self.fetcher = fetcher
        self.sink = sink
        self.detail_sink = detail_sink
        self.config = pipeline or PipelineConfig()
        self.token = fetcher.token
        self.log = log or fetcher.log
        self.now = now
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.result = RunResult(job.name)
        self.stage = "idle"
        self.requests_total: int | None = None
        self.offset: int | None = None
        self.ids: list[Any] = []
        self._failure: str | None = None
        self._began = 0.0
        self._progress: Progress = Progress(job=job.name)
        self._opened: list[Sink] = []

    # ---- the run ------------------------------------------------------------------------
    async def run(self) -> RunResult:
        """Collect once; never raises for source or sink trouble (see the RunResult)."""
        self._began = time.monotonic()
        self.result.started_at = time.time()
        if self.token.is_cancelled:
            self.log.warning("cancelled before start, nothing sent", reason=self.token.reason)
            for close in self.closers:
                await close()
            return self._conclude()
        record = RunRecord(
            run_id=self.run_id,
            job=self.job.name,
            strategy=self.job.strategy.type,
            status="RUNNING",
            started_at=self.result.started_at,
        )
        await self.store.start_run(record)
        try:
            await self._open_sinks()
            self.stage = "list"
            began = time.monotonic()
            try:
                strategy = self.job.strategy.type
                if strategy == "incremental":
                    await self._incremental()
                elif strategy == "window":
                    await self._window()
                else:
                    await self._full()
            finally:
                self.result.add_time("list", time.monotonic() - began)
            if self.job.detail.enabled and self._can_go_on():
                await self._details()
        except Exception as exc:  # a bug or a store outage: the run is FAILED, not lost
            self._fail(f"{type(exc).__name__}: {exc}")
            self.log.error("run crashed", error=f"{type(exc).__name__}: {exc}")
        finally:
            await self._close_sinks()
            for close in self.closers:
                await close()
        result = self._conclude()
        record.status = result.status.value
        record.finished_at = result.finished_at
        record.result = result.to_dict()
        record.log = [
            _line_text(line)
            for line in self.log.lines()
            if line["ts"] >= (self.result.started_at or 0)
        ][-1000:]
        self._progress.status = result.status.value
        self._progress.run_id = None
        await self.store.save_progress(self._progress)
        await self.store.finish_run(record)
        return result

    async def _open_sinks(self) -> None:
        for sink in (self.sink, self.detail_sink):
            if sink is not None and sink not in self._opened:
                await sink.open()
                self._opened.append(sink)

    async def _close_sinks(self) -> None:
        while self._opened:
            await self._opened.pop().close()

    # ---- incremental (seed 000, corrected) ----------------------------------------------
    async def _incremental(self) -> None:
        strategy = self.job.strategy
        total = await self._probe_total()
        if total is None:
            return
        saved = await self._load_progress()
        state = IncrementalState.from_dict(saved.state.get("incremental") if saved else None)
        run = plan_incremental(total, state, strategy.batch_size, overlap=strategy.overlap)
        pending: list[Sweep] = list(run.sweeps)
        deferred: list[Sweep] = []
        self.requests_total = sum(_sweep_requests(s) for s in pending)
        self.log.info(
            "incremental plan",
            total=total,
            previous_total=state.covered_total,
            start_offset=run.last_start_offset,
            sweeps=[s.to_dict() for s in pending],
            requests=self.requests_total,
            first_run=state.first_run,
        )

        async def save() -> None:
            run.sweeps = pending + deferred
            head = pending[0].request() if pending else None
            self._progress.start_offset = run.last_start_offset
            self._progress.saved_offset = head[0] if head else None
            self._progress.last_total = total
            self._progress.state = {"incremental": run.to_dict()}
            await self.store.save_progress(self._progress)

        await save()
        try:
            while pending:
                sweep = pending[0]
                req = sweep.request()
                if req is None:
                    pending.pop(0)
                    await save()
                    continue
                self._check_go_on()
                offset, limit = req
                self.offset = offset
                unit = await self._fetch_unit(
                    list_request(self.job.source, offset=offset, limit=limit)
                )
                if unit is None or not unit.parsed or not unit.written_ok:
                    # Not delivered: keep this one window for the next run, go on.
                    deferred.append(
                        Sweep(next=sweep.next, floor=sweep.next + sweep.size - 1, size=sweep.size)
                    )
                    pending[0] = Sweep(
                        sweep.next - sweep.size,
                        sweep.floor,
                        sweep.size,
                        sweep.expire_stop,
                        sweep.expired,
                    )
                    self.log.warning("batch deferred to the next run", offset=offset, limit=limit)
                else:
                    all_expired = strategy.filter_days is not None and unit.fresh == 0
                    pending[0] = sweep.after_batch(
                        all_expired=all_expired,
                        max_expired_batches=strategy.max_expired_batches,
                    )
                    self.log.info(
                        "batch delivered",
                        offset=offset,
                        limit=limit,
                        items=unit.items,
                        fresh=unit.fresh,
                        expired_streak=pending[0].expired if sweep.expire_stop else None,
                    )
                    if pending[0].done and sweep.expire_stop and all_expired:
                        self.log.info(
                            "first run stops: expired batches in a row",
                            count=pending[0].expired,
                            offset=offset,
                        )
                await save()
        except _Stop:
            await save()

    async def _probe_total(self) -> int | None:
        """The source's total, from a one-item list request at offset 0."""
        req = list_request(self.job.source, offset=0, limit=1)
        try:
            response = await self.fetcher.fetch(req, stage="list")
            page = read_page(self.job.source, response.json(), where=f"job {self.job.name}")
        except (CancelledError, TooManyFailures, FetchError, ValueError) as exc:
            if not self.token.is_cancelled:
                self._fail(f"could not read the total from {req.url}: {exc}")
            return None
        if page.total is None:
            self._fail(
                f"the answer of {req.url} has no total at total_path "
                f"{self.job.source.total_path!r}; set source.total_path"
            )
            return None
        return page.total

    async def _load_progress(self) -> Progress | None:
        saved = await self.store.load_progress(self.job.name)
        if saved is not None and saved.run_id and saved.run_id != self.run_id:
            self.log.warning(
                "previous run did not finish (crashed); resuming its progress",
                previous_run=saved.run_id,
                saved_offset=saved.saved_offset,
            )
            await self.store.finish_run(
                RunRecord(
                    run_id=saved.run_id,
                    job=self.job.name,
                    strategy=self.job.strategy.type,
                    status="CRASHED",
                    started_at=saved.updated_at,
                    finished_at=time.time(),
                    result=None,
                    log=[
                        "run ended without finishing (process killed?); "
                        f"resumed by run {self.run_id}"
                    ],
                )
            )
        self._progress = Progress(
            job=self.job.name,
            run_id=self.run_id,
            status="RUNNING",
            start_offset=saved.start_offset if saved else None,
            saved_offset=saved.saved_offset if saved else None,
            last_total=saved.last_total if saved else None,
            state=dict(saved.state) if saved else {},
        )
        return saved

    # ---- forward full scan ---------------------------------------------------------------
    async def _full(self) -> None:
        saved = await self._load_progress()
        cursor = await self.store.get_cursor(self.job.name, FULL_CURSOR)
        start = int(cursor) if cursor else 0
        if start:
            self.log.info("full scan resumes", offset=start)
        await self.store.save_progress(self._progress)
        del saved
        size = self.job.strategy.batch_size
        try:
            for page in forward_pages(
                size, start_page=self.job.source.pagination.start_page, start_offset=start
            ):
                self._check_go_on()
                self.offset = page.offset
                unit = await self._fetch_unit(
                    list_request(
                        self.job.source, offset=page.offset, limit=page.limit, page=page.page
                    )
                )
                if unit is None or not unit.parsed or not unit.written_ok:
                    self._fail(
                        f"page at offset {page.offset} was not delivered; the next run "
                        "resumes there"
                    )
                    return
                if unit.total is not None:
                    self.requests_total = -(-unit.total // size)
                next_offset = page.offset + page.limit
                done = forward_done(page, unit.items, unit.total)
                await self.store.set_cursor(
                    self.job.name, FULL_CURSOR, "" if done else str(next_offset)
                )
                self._progress.saved_offset = None if done else next_offset
                self._progress.last_total = unit.total
                await self.store.save_progress(self._progress)
                if done:
                    return
        except _Stop:
            return

    # ---- time windows ---------------------------------------------------------------------
    async def _window(self) -> None:
        pg = self.job.source.pagination
        await self._load_progress()
        cursor = await self.store.get_cursor(self.job.name, WINDOW_CURSOR)
        end = self.now() - self.job.strategy.lag
        start = datetime.fromisoformat(cursor) if cursor else end - pg.window
        segments = window_segments(start, end, pg.segment)
        self.requests_total = len(segments) if pg.type == "window" else None
        self.log.info(
            "window plan", start=start.isoformat(), end=end.isoformat(), segments=len(segments)
        )
        self._progress.state = {"window": {"cursor": start.isoformat(), "end": end.isoformat()}}
        await self.store.save_progress(self._progress)
        for seg_from, seg_to in segments:
            try:
                records = await self._fetch_segment((seg_from, seg_to))
            except _Stop:
                self.log.warning(
                    "segment not committed, cursor stays",
                    segment_from=seg_from.isoformat(),
                    cursor=start.isoformat(),
                )
                return
            unit = await self._deliver(records)
            if not unit.written_ok:
                self._fail(
                    f"segment {seg_from.isoformat()}..{seg_to.isoformat()} was not "
                    "written; the cursor stays before it"
                )
                return
            start = seg_to
            await self.store.set_cursor(self.job.name, WINDOW_CURSOR, seg_to.isoformat())
            self._progress.state = {
                "window": {"cursor": seg_to.isoformat(), "end": end.isoformat()}
            }
            await self.store.save_progress(self._progress)
            self.log.info(
                "segment committed",
                segment_from=seg_from.isoformat(),
                segment_to=seg_to.isoformat(),
                records=len(records),
            )

    async def _fetch_segment(self, window: tuple[datetime, datetime]) -> list[dict[str, Any]]:
        """Every fresh record of one segment, all pages; ``_Stop`` when one page fails."""
        source = self.job.source
        records: list[dict[str, Any]] = []
        if source.pagination.type == "window":
            pages: Any = [None]
        else:
            pages = forward_pages(
                self.job.strategy.batch_size, start_page=source.pagination.start_page
            )
        for page in pages:
            self._check_go_on()
            if page is None:
                req = list_request(source, window=window)
            else:
                req = list_request(
                    source, offset=page.offset, limit=page.limit, page=page.page, window=window
                )
            try:
                response = await self.fetcher.fetch(req, stage="list")
                parsed = read_page(source, response.json(), where=f"job {self.job.name}")
            except CancelledError:
                raise _Stop from None
            except TooManyFailures as exc:
                self._fail(str(exc))
                raise _Stop from None
            except (FetchError, ValueError) as exc:
                self._fail(f"segment {window[0].isoformat()} failed: {exc}")
                raise _Stop from None
            records.extend(self._fresh(parsed, response))
            if page is None or forward_done(page, len(parsed.items), parsed.total):
                break
        return records

    # ---- delivery ---------------------------------------------------------------------------
    async def _fetch_unit(self, req: Request) -> _Unit | None:
        """Fetch one list request and deliver its items; None when the request failed."""
        try:
            response = await self.fetcher.fetch(req, stage="list")
        except CancelledError:
            raise _Stop from None
        except TooManyFailures as exc:
            self._fail(str(exc))
            raise _Stop from None
        except FetchError:
            return None  # recorded by the fetcher
        return await self._deliver(response)

    async def _deliver(self, item: Response | list[dict[str, Any]]) -> _Unit:
        """Process ``item`` and write its records as one batch; return once written.

        One unit is one transaction, so progress saved after it never runs ahead of the
        sink; processing runs in a worker thread (dates and filters are CPU work).
        """
        unit = _Unit()
        began = time.monotonic()
        try:
            if isinstance(item, Response):
                records = await asyncio.to_thread(self._process_response, item, unit)
            else:
                records, unit.items = item, len(item)
        except (SourceError, ValueError) as exc:
            where = item.request.url if isinstance(item, Response) else "segment"
            self.result.records_failed += 1
            self.result.add_error("process", item=where, error=f"{type(exc).__name__}: {exc}")
            self.log.error("processing failed", item=where, error=f"{type(exc).__name__}: {exc}")
            return unit
        finally:
            self.result.add_time("process", time.monotonic() - began)
        unit.parsed = True
        unit.fresh = len(records)
        self.result.records_processed += len(records)
        unit.written_ok = await self._write(records)
        if unit.written_ok:
            self.ids.extend(i for r in records if (i := item_id(self.job.source, r)) is not None)
        return unit

    def _process_response(self, response: Response, unit: _Unit) -> list[dict[str, Any]]:
        page = read_page(self.job.source, response.json(), where=response.request.url)
        unit.items, unit.total = len(page.items), page.total
        return self._fresh(page, response)

    async def _write(self, records: list[dict[str, Any]]) -> bool:
        """One unit in one ``write_batch`` (one transaction), counted like the writer."""
        if not records:
            return True
        result = self.result
        began = time.monotonic()
        try:
            outcome = await self.sink.write_batch(records)
        except Exception as exc:  # the sink rolled the batch back
            result.batches_failed += 1
            result.records_write_failed += len(records)
            error = f"{type(exc).__name__}: {exc}"
            result.add_error(
                "write",
                error=error,
                batch_size=len(records),
                first_id=item_id(self.job.source, records[0]),
            )
            self.log.error(
                "batch failed, rolled back", size=len(records), sink=self.sink.name, error=error
            )
            return False
        finally:
            result.add_time("write", time.monotonic() - began)
        result.batches_written += 1
        result.records_written += outcome.written
        result.records_skipped += outcome.skipped
        result.records_write_failed += outcome.failed
        for error in outcome.errors[:10]:
            result.add_error("write", error=error, batch_size=len(records))
        self.log.info(
            "batch written",
            size=len(records),
            sink=self.sink.name,
            inserted=outcome.inserted,
            updated=outcome.updated,
            skipped=outcome.skipped,
            failed=outcome.failed,
        )
        return outcome.failed == 0

    def _fresh(self, page: Page, response: Response) -> list[dict[str, Any]]:
        """The page's items inside ``filter_days``, with source metadata."""
        now = self.now()
        days = self.job.strategy.filter_days
        endpoint = urlsplit(response.request.url).path or "/"
        fetched = datetime.fromtimestamp(response.fetched_at).astimezone().isoformat()
        out = []
        for item in page.items:
            if not is_fresh(item_date(self.job.source, item), now, days):
                continue
            record = dict(item)
            record.setdefault("source_endpoint", endpoint)
            record.setdefault("fetched_at", fetched)
            out.append(record)
        return out

    # ---- detail mode ------------------------------------------------------------------------
    async def _details(self) -> None:
        """Fetch each delivered id from the detail endpoint, through the same scheduler."""
        self.stage = "detail"
        detail = self.job.detail
        sink = self.detail_sink or self.sink
        ids = list(self.ids)
        self.log.info("detail stage started", ids=len(ids), sink=sink.name)
        began = time.monotonic()

        def process(response: Response) -> list[dict[str, Any]]:
            body = get_path(response.json(), detail.item_path)
            if not isinstance(body, dict):
                raise SourceError(
                    f"{response.request.url}: no object at item_path {detail.item_path!r}"
                )
            record = dict(body)
            record.setdefault("source_endpoint", urlsplit(response.request.url).path)
            return [record]

        writer = BatchWriter(
            sink,
            batch_size=self.config.batch_size,
            batch_timeout=self.config.batch_timeout,
            result=self.result,
            log=self.log,
            backlog_limit=self.config.queue_size * 2,
        )
        pool = ProcessingPool(
            process,
            workers=self.config.workers,
            queue_size=self.config.queue_size,
            writer=writer,
            result=self.result,
            log=self.log,
        )
        writer.start()
        pool.start()
        seen: set[str] = set()
        try:
            for n, ident in enumerate(ids):
                if not self._can_go_on():
                    self.result.detail_skipped += len(ids) - n
                    self.log.warning(
                        "detail stage stopped",
                        skipped=len(ids) - n,
                        reason=self.token.reason or self._failure,
                    )
                    break
                key = repr(ident)
                if ident == "" or key in seen:
                    self.result.detail_skipped += 1
                    continue
                seen.add(key)
                try:
                    response = await self.fetcher.fetch(
                        detail_request(self.job.source, detail, ident), stage="detail"
                    )
                except CancelledError:
                    self.result.detail_skipped += len(ids) - n
                    break
                except TooManyFailures as exc:
                    self._fail(str(exc))
                    self.result.detail_skipped += len(ids) - n - 1
                    break
                except FetchError as exc:
                    self.log.error("detail failed, skipped", id=ident, error=str(exc))
                    continue
                await pool.submit(response)
        finally:
            await pool.close()
            await writer.close()
            self.result.add_time("detail", time.monotonic() - began)

    # ---- state --------------------------------------------------------------------------------
    def _can_go_on(self) -> bool:
        return (
            not self.token.is_cancelled and self._failure is None and self.fetcher.tripped is None
        )

    def _check_go_on(self) -> None:
        if not self._can_go_on():
            raise _Stop

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
            self.log.error("run failing", reason=reason)

    def _conclude(self) -> RunResult:
        result = self.result
        listed = self.fetcher.stage("list")
        detail = self.fetcher.stage("detail")
        result.requests_ok, result.requests_failed = listed.ok, listed.failed
        result.requests_retried = listed.retries + detail.retries
        result.detail_ok, result.detail_failed = detail.ok, detail.failed
        result.errors["request"] = list(listed.errors)
        result.errors["detail"] = list(detail.errors)
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
        self.log.info("run finished", status=result.status.value, summary=result.summary())
        return result

    def progress(self) -> dict[str, Any]:
        """A snapshot in the pipeline's shape (for ``describe_progress`` and Rich bars)."""
        listed = self.fetcher.stage("list")
        detail = self.fetcher.stage("detail")
        total = self.requests_total
        if self.stage == "detail":
            total = (total or listed.done) + len(self.ids)
        return {
            "job": self.job.name,
            "run_id": self.run_id,
            "stage": self.stage,
            "offset": self.offset,
            "requests_done": listed.done + detail.done,
            "requests_total": total,
            "requests_waiting": self.fetcher.scheduler.waiting,
            "queue": 0,
            "queue_size": self.config.queue_size,
            "active_workers": 0,
            "workers": self.config.workers,
            "write_backlog": 0,
            "processed": self.result.records_processed,
            "written": self.result.records_written,
            "failed": self.result.records_failed + self.result.records_write_failed,
            "elapsed": round(time.monotonic() - self._began, 3) if self._began else 0.0,
        }


def _sweep_requests(sweep: Sweep) -> int:
    """How many requests a sweep makes at most (expiry may end it sooner)."""
    if sweep.done:
        return 0
    return -(-(sweep.next + sweep.size - max(sweep.floor, 0)) // sweep.size)


def _line_text(line: dict[str, Any]) -> str:
    from crawlhub.fetch.joblog import format_line

    return format_line(line)

"""One run of a collection job: walk the source by its strategy, deliver, save progress.

Requests go through the job's ``Fetcher`` (scheduler, retries, token) and responses
through its ``Pipeline`` (processing pool, single writer); every unit (an incremental
batch, a forward page, a time segment) is written before the next request and before
progress is saved (``Pipeline.flush`` / ``Pipeline.atomic_batch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from crawlhub.collect.config import CollectJobConfig
from crawlhub.collect.lease import DEFAULT_LEASE_TTL, RunLease
from crawlhub.collect.logship import DEFAULT_LOG_KEEP, StoredLog
from crawlhub.collect.plan import (
    IncrementalState,
    Sweep,
    forward_done,
    forward_pages,
    plan_incremental,
    window_segments,
)
from crawlhub.collect.source import (
    ListPage,
    detail_request,
    is_fresh,
    item_date,
    item_id,
    list_request,
    read_page,
)
from crawlhub.collect.store.base import JobRunRecord, MetadataStore, Progress
from crawlhub.core.errors import CancelledError, FetchError
from crawlhub.core.jobprotocol import EXIT, PAUSE, RUN
from crawlhub.fetch.fetcher import Fetcher
from crawlhub.fetch.http import Request, Response
from crawlhub.fetch.joblog import JobLog, format_line
from crawlhub.fetch.retry import TooManyFailures
from crawlhub.pipeline.config import PipelineConfig
from crawlhub.pipeline.result import RunResult
from crawlhub.pipeline.run import DetailMode, Pipeline
from crawlhub.sdk import Counters
from crawlhub.sinks.base import Sink

#: Cursor names in the metadata store.
WINDOW_CURSOR = "window_end"
FULL_CURSOR = "full_offset"
#: Seconds between two looks at the run's control (pause / continue / exit).
CONTROL_POLL = 0.1
#: Seconds between two reports of the run's counters.
COUNTERS_EVERY = 0.5


def _now() -> datetime:
    return datetime.now().astimezone()


@dataclass
class _Unit:
    """What one delivered unit held (filled by the processing worker)."""

    items: int = 0
    fresh: int = 0
    parsed: bool = False
    total: int | None = None
    written_ok: bool = False
    ids: list[Any] = field(default_factory=list)


class _Stop(Exception):
    """The list stage ends here (cancelled, or too many failures): progress stays put."""


class JobRun:
    """Runs ``job`` once: ``result = await JobRun(job, ...).run()``.

    The caller owns the fetcher (its scheduler may be shared) and the store; the run's
    pipeline opens and closes the sinks. ``progress()`` is a live snapshot for bars.

    ``control`` (anything with ``state``: ``run`` / ``pause`` / ``exit``, e.g.
    ``crawlhub.sdk.control()``): paused, no new request is sent (those in flight finish
    and are delivered, the lease is kept); exit cancels the run like Ctrl-C (CANCELLED,
    what was processed written, progress saved). ``counters`` (``crawlhub.sdk.Counters``)
    get ``requests``, ``items`` and ``errors`` while the run lasts.
    """

    def __init__(
        self,
        job: CollectJobConfig,
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
        lease_ttl: float = DEFAULT_LEASE_TTL,
        log_keep: int = DEFAULT_LOG_KEEP,
        control: Any | None = None,
        counters: Counters | None = None,
    ) -> None:
        self.job = job
        self.control = control
        self.counters = counters
        #: the run's control says pause: requests wait
        self.paused = False
        self.store = store
        self.fetcher = fetcher
        self.sink = sink
        self.detail_sink = detail_sink
        self.config = pipeline or PipelineConfig()
        self.token = fetcher.token
        self.log = log or fetcher.log
        self.now = now
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.closers = list(closers or [])
        self.lease = RunLease(store, job.name, self.run_id, ttl=lease_ttl, log=self.log)
        self.log_keep = log_keep
        self.pipeline = Pipeline(
            self._process,
            sink,
            self.config,
            self.token,
            job.name,
            self.log,
            fetcher=fetcher,
            id_field=job.source.id_field,
        )
        self.result: RunResult = self.pipeline.result
        self.requests_total: int | None = None
        self.offset: int | None = None
        self.ids: list[Any] = []  # detail ids this run's list stage delivered
        self.detail_total: int | None = None  # ids the detail stage works through
        self._failure: str | None = None
        self._progress: Progress = Progress(job=job.name)
        self._loaded = False  # _progress holds what the store had (safe to save back)

    # ---- the run ------------------------------------------------------------------------
    async def run(self) -> RunResult:
        """Collect once; never raises for source or sink trouble (see the RunResult).

        Raises :class:`JobRunning` when the job runs elsewhere (its lease is taken).
        """
        if self.token.is_cancelled:  # nothing sent, nothing opened, progress untouched
            await self._close()
            return await self.pipeline.finish()
        await self.claim()
        try:
            async with StoredLog(self.store, self.log, keep=self.log_keep):
                async with self.lease.keep(self.token):
                    return await self._run()
        finally:
            await self.lease.release()

    async def claim(self) -> None:
        """Take the job's lease now (``run`` does it too): :class:`JobRunning` naming the
        holder when the job runs elsewhere; this run's HTTP client is closed then."""
        if self.lease.held:
            return
        try:
            await self.lease.acquire()
        except BaseException:
            await self._close()
            raise

    async def _run(self) -> RunResult:
        record = JobRunRecord(
            run_id=self.run_id,
            job=self.job.name,
            strategy=self.job.strategy.type,
            status="RUNNING",
            started_at=time.time(),
        )
        await self.store.start_run(record)
        follower = None
        if self.control is not None or self.counters is not None:
            follower = asyncio.create_task(self._follow_control())
        try:
            # Before any request: what the previous runs saved is in hand (and marked as
            # this run's), so however this run ends, the final save keeps it.
            await self._load_progress()
            await self.pipeline.start()
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
                await self.pipeline.run([], details=await self._detail_mode())
        except Exception as exc:  # a bug or a store outage: the run is FAILED, not lost
            self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            result = await self.pipeline.finish()
            await self._close()
            if follower is not None:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
                self._report_counters(flush=True)
        record.status = result.status.value
        record.finished_at = result.finished_at
        record.result = result.to_dict()
        record.log = [
            format_line(line) for line in self.log.lines() if line["ts"] >= record.started_at
        ][-1000:]
        if self._loaded:  # never overwrite saved progress with a blank one
            self._progress.status = result.status.value
            self._progress.run_id = None
            await self.store.save_progress(self._progress)
        await self.store.finish_run(record)
        return result

    async def _close(self) -> None:
        """Close what the run owns (its HTTP client); safe to call twice."""
        while self.closers:
            await self.closers.pop()()

    async def _incremental(self) -> None:
        strategy = self.job.strategy
        total = await self._probe_total()
        if total is None:
            return
        state = IncrementalState.from_dict(self._progress.state.get("incremental"))
        run = plan_incremental(total, state, strategy.batch_size, overlap=strategy.overlap)
        pending: list[Sweep] = list(run.sweeps)
        deferred: list[Sweep] = []
        self.requests_total = 1 + sum(_sweep_requests(s) for s in pending)  # + the total
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
        """Read the saved progress, close a crashed predecessor's run, mark it ours."""
        saved = await self.store.load_progress(self.job.name)
        if saved is not None and saved.run_id and saved.run_id != self.run_id:
            self.log.warning(
                "previous run did not finish (crashed); resuming its progress",
                previous_run=saved.run_id,
                saved_offset=saved.saved_offset,
            )
            await self.store.finish_run(
                JobRunRecord(
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
        self._loaded = True
        await self.store.save_progress(self._progress)
        return saved

    # ---- forward full scan ---------------------------------------------------------------
    async def _full(self) -> None:
        cursor = await self.store.get_cursor(self.job.name, FULL_CURSOR)
        start = int(cursor) if cursor else 0
        if start:
            self.log.info("full scan resumes", offset=start)
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
            name = f"{seg_from.isoformat()}..{seg_to.isoformat()}"
            units: list[_Unit] = []
            try:
                async with self.pipeline.atomic_batch(name) as segment:
                    await self._fetch_segment((seg_from, seg_to), units)
            except _Stop:
                self.log.warning(
                    "segment not committed, cursor stays", segment=name, cursor=start.isoformat()
                )
                return
            if not segment.written:
                self._fail(f"segment {name} was not written; the cursor stays before it")
                return
            await self._keep_detail_ids([i for unit in units for i in unit.ids])
            start = seg_to
            await self.store.set_cursor(self.job.name, WINDOW_CURSOR, seg_to.isoformat())
            self._progress.state = {
                "window": {"cursor": seg_to.isoformat(), "end": end.isoformat()}
            }
            await self.store.save_progress(self._progress)

    async def _fetch_segment(self, window: tuple[datetime, datetime], units: list[_Unit]) -> None:
        """Submit every page of one segment (each page's ``_Unit`` appended to ``units``);
        ``_Stop`` (segment dropped) when one fails."""
        source = self.job.source
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
                parsed = read_page(source, response.json(), where=req.url)
            except CancelledError:
                raise _Stop from None
            except TooManyFailures as exc:
                self._fail(str(exc))
                raise _Stop from None
            except (FetchError, ValueError) as exc:
                self._fail(f"segment {window[0].isoformat()} failed: {exc}")
                raise _Stop from None
            unit = _Unit()
            response.request.meta["unit"] = unit
            units.append(unit)
            await self.pipeline.submit(response)
            if page is None or forward_done(page, len(parsed.items), parsed.total):
                return

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
        unit = _Unit()
        response.request.meta["unit"] = unit
        await self.pipeline.submit(response)
        # The barrier: this unit is processed and written before the next request.
        written = await self.pipeline.flush()
        unit.written_ok = written and unit.parsed
        if unit.written_ok:
            await self._keep_detail_ids(unit.ids)
        return unit

    async def _keep_detail_ids(self, ids: list[Any]) -> None:
        """Save the ids of written records for the detail stage, before progress moves
        past them: a stop or a kill before their details are fetched loses none."""
        if self.job.detail.enabled and ids:
            await self.store.add_detail_ids(self.job.name, ids)
            self.ids.extend(ids)

    def _process(self, response: Response) -> list[dict[str, Any]]:
        """The processing pool's work on one list answer: read it, keep fresh items."""
        page = read_page(self.job.source, response.json(), where=response.request.url)
        records = self._fresh(page)
        unit = response.request.meta.get("unit")
        if isinstance(unit, _Unit):
            unit.items, unit.total, unit.fresh = len(page.items), page.total, len(records)
            unit.ids = [i for r in records if (i := item_id(self.job.source, r)) is not None]
            unit.parsed = True
        return records

    def _fresh(self, page: ListPage) -> list[dict[str, Any]]:
        """The page's items inside ``filter_days`` (copies: the writer adds metadata)."""
        now = self.now()
        days = self.job.strategy.filter_days
        source = self.job.source
        return [dict(i) for i in page.items if is_fresh(item_date(source, i), now, days)]

    async def _detail_mode(self) -> DetailMode:
        """Details of every pending id (this run's and those earlier runs left); each id
        leaves the store once its detail is written or failed for good."""
        detail = self.job.detail
        ids = await self.store.detail_ids(self.job.name)
        self.detail_total = len(ids)
        earlier = len(ids) - len(set(map(repr, self.ids)) & set(map(repr, ids)))
        if earlier:
            self.log.info("detail ids left by earlier runs are fetched too", ids=earlier)

        async def done(settled: list[Any]) -> None:
            await self.store.remove_detail_ids(self.job.name, settled)

        return DetailMode(
            request=lambda ident: detail_request(self.job.source, detail, ident),
            item_path=detail.item_path,
            sink=self.detail_sink,
            id_field=self.job.source.id_field,
            ids=ids,
            done=done,
            checkpoint_every=self.config.batch_size,
        )

    # ---- control ------------------------------------------------------------------------------
    async def _follow_control(self) -> None:
        """Apply the run's control (one cheap look a poll) and report its counters."""
        control, token = self.control, self.token
        gate = asyncio.Event()
        gate.set()

        async def hold() -> None:
            if not gate.is_set():
                await token.run(gate.wait())  # CancelledError when the run is cancelled

        self.fetcher.hold = hold
        reported = 0.0
        try:
            while not token.is_cancelled:
                state = control.state if control is not None else RUN
                if state == EXIT:
                    self.log.warning("exit requested: the run stops; what was processed is"
                                     " written and progress saved")
                    token.cancel("exit requested")
                    break
                if state == PAUSE and gate.is_set():
                    gate.clear()
                    self.paused = True
                    self.log.info("paused: no new requests; those in flight finish")
                elif state == RUN and not gate.is_set():
                    gate.set()
                    self.paused = False
                    self.log.info("continued")
                now = time.monotonic()
                if now - reported >= COUNTERS_EVERY:
                    reported = now
                    self._report_counters()
                await token.wait(CONTROL_POLL)
        finally:
            self.fetcher.hold = None
            gate.set()

    def _report_counters(self, *, flush: bool = False) -> None:
        if self.counters is None:
            return
        snap = self.pipeline.progress()
        failed = self.fetcher.stage("list").failed + self.fetcher.stage("detail").failed
        self.counters.update({"requests": snap["requests_done"], "items": snap["written"],
                              "errors": snap["failed"] + failed})
        if flush:
            self.counters.flush()

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
            self.pipeline.fail(reason)

    def progress(self) -> dict[str, Any]:
        """The pipeline's snapshot (queues, workers, written) plus the walk's position."""
        snap = self.pipeline.progress()
        snap["run_id"] = self.run_id
        snap["offset"] = self.offset
        snap["paused"] = self.paused
        if snap.get("stage") in ("list", "idle"):
            snap["requests_total"] = self.requests_total
        elif self.job.detail.enabled:
            snap["requests_total"] = (self.requests_total or 0) + (
                self.detail_total if self.detail_total is not None else len(self.ids)
            )
        return snap


def _sweep_requests(sweep: Sweep) -> int:
    """How many requests a sweep makes at most (expiry may end it sooner)."""
    if sweep.done:
        return 0
    return -(-(sweep.next + sweep.size - max(sweep.floor, 0)) // sweep.size)

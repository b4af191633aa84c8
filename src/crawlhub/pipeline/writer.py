"""The single writer: batches processed records and writes each batch in one transaction.

A batch goes out at ``batch_size`` records or ``batch_timeout`` seconds after its first
record; a failed batch (the sink raised, so it rolled back) is counted, logged, and the run
goes on. ``close()`` writes everything still queued before it returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from crawlhub.fetch.joblog import JobLog
from crawlhub.pipeline.result import RunResult
from crawlhub.sinks.base import Sink

_STOP = object()


class _Barrier:
    """A marker in the writer's queue: write (or drop) the open batch, then answer."""

    def __init__(self, drop: bool = False) -> None:
        self.drop = drop
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()


class BatchWriter:
    """One task that owns every write of a run. Callers: the processing pool (``put``)."""

    def __init__(
        self,
        sink: Sink,
        *,
        batch_size: int,
        batch_timeout: float,
        result: RunResult,
        log: JobLog,
        backlog_limit: int,
        id_field: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"pipeline.batch_size must be >= 1, got {batch_size!r}")
        self.sink = sink
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout
        self.result = result
        self.log = log
        self.backlog_limit = backlog_limit
        self.id_field = id_field
        self.written_ids: list[Any] = []  # ids of written records, when id_field is set
        self.batch_sizes: list[int] = []  # every batch handed to the sink, in order
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._buffered = 0
        self._task: asyncio.Task[None] | None = None
        self._over_backlog = False
        #: While True, neither size nor timeout closes a batch: a segment is one batch.
        self.hold = False

    @property
    def pending(self) -> int:
        """Records waiting to be written (queued plus in the open batch)."""
        return self._queue.qsize() + self._buffered

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"writer:{self.result.job_code}")

    def put(self, record: dict[str, Any]) -> None:
        """Queue a processed record (never blocks: the pool's queue is the bound)."""
        self._queue.put_nowait(record)
        pending = self.pending
        if pending > self.backlog_limit and not self._over_backlog:
            self._over_backlog = True
            self.log.warning("write backlog high", pending=pending, limit=self.backlog_limit,
                             hint="the sink is slower than processing")
        elif pending <= self.backlog_limit // 2:
            self._over_backlog = False

    async def flush(self, *, drop: bool = False) -> bool:
        """Write everything queued so far as one batch; True if it went in (or was empty).

        ``drop=True`` throws the queued records away instead (a failed segment), counting
        them as write failures.
        """
        if self._task is None:
            return True
        barrier = _Barrier(drop)
        self._queue.put_nowait(barrier)
        return await barrier.done

    async def close(self) -> None:
        """Write everything queued, then stop."""
        if self._task is None:
            return
        self._queue.put_nowait(_STOP)
        await self._task
        self._task = None

    async def _run(self) -> None:
        batch: list[dict[str, Any]] = []
        deadline = 0.0
        while True:
            try:
                if batch and not self.hold:
                    item = await asyncio.wait_for(
                        self._queue.get(), max(0.0, deadline - time.monotonic())
                    )
                else:
                    item = await self._queue.get()
            except TimeoutError:
                await self._flush(batch, "timeout")
                batch = []
                self._buffered = 0
                continue
            if item is _STOP:
                await self._flush(batch, "final")
                self._buffered = 0
                return
            if isinstance(item, _Barrier):
                if item.drop:
                    ok = False
                    self._drop(batch)
                else:
                    ok = await self._flush(batch, "flush")
                batch = []
                self._buffered = 0
                if not item.done.done():
                    item.done.set_result(ok)
                continue
            if not batch:
                deadline = time.monotonic() + self.batch_timeout
            batch.append(item)
            self._buffered = len(batch)
            if len(batch) >= self.batch_size and not self.hold:
                await self._flush(batch, "size")
                batch = []
                self._buffered = 0

    def _drop(self, batch: Sequence[dict[str, Any]]) -> None:
        if batch:
            self.result.records_write_failed += len(batch)
            self.result.add_error("write", error="segment failed: records dropped unwritten",
                                  batch_size=len(batch))
            self.log.warning("segment dropped, nothing written", size=len(batch))

    async def _flush(self, batch: Sequence[dict[str, Any]], why: str) -> bool:
        if not batch:
            return True
        self.batch_sizes.append(len(batch))
        began = time.monotonic()
        try:
            outcome = await self.sink.write_batch(batch)
        except Exception as exc:  # the sink rolled the batch back; the run goes on
            self.result.batches_failed += 1
            self.result.records_write_failed += len(batch)
            first = batch[0].get(self.id_field or "id") if isinstance(batch[0], dict) else None
            self.result.add_error("write", error=f"{type(exc).__name__}: {exc}",
                                  batch_size=len(batch), first_id=first)
            self.log.error("batch failed, rolled back", size=len(batch), sink=self.sink.name,
                           error=f"{type(exc).__name__}: {exc}")
            return False
        else:
            self.result.batches_written += 1
            self.result.records_written += outcome.written
            self.result.records_skipped += outcome.skipped
            self.result.records_write_failed += outcome.failed
            for error in outcome.errors[:10]:
                self.result.add_error("write", error=error, batch_size=len(batch))
            if self.id_field is not None:
                self.written_ids.extend(r.get(self.id_field) for r in batch)
            self.log.info("batch written", size=len(batch), why=why, sink=self.sink.name,
                          inserted=outcome.inserted, updated=outcome.updated,
                          skipped=outcome.skipped, failed=outcome.failed)
            return True
        finally:
            self.result.add_time("write", time.monotonic() - began)

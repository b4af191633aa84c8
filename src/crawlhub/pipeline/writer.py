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
                if batch:
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
            if not batch:
                deadline = time.monotonic() + self.batch_timeout
            batch.append(item)
            self._buffered = len(batch)
            if len(batch) >= self.batch_size:
                await self._flush(batch, "size")
                batch = []
                self._buffered = 0

    async def _flush(self, batch: Sequence[dict[str, Any]], why: str) -> None:
        if not batch:
            return
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
        finally:
            self.result.add_time("write", time.monotonic() - began)

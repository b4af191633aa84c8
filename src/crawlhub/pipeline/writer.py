"""The single writer: batches processed records and writes each batch in one transaction.

A batch goes out at ``batch_size`` records or ``batch_timeout`` seconds after its first
record; a failed batch (the sink raised, so it rolled back) is counted, logged, and the run
goes on. ``close()`` writes everything still queued before it returns.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from crawlhub.fetch.joblog import JobLog
from crawlhub.pipeline.result import RunResult
from crawlhub.sinks.base import Sink


class _Marker:
    """Not a record: an order to the writer task, queued in line with the records."""


class _Stop(_Marker):
    """The last marker in the writer's queue: write the open batch, then end."""


_STOP = _Stop()


class _Barrier(_Marker):
    """A marker in the writer's queue: write (or drop) the open batch, then answer."""

    def __init__(self, drop: bool = False) -> None:
        self.drop = drop
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class BatchWriter:
    """One task that owns every write of a run. Callers: the processing pool (``put_many``).

    Records wait in a plain deque. The writer task takes whatever is there without
    awaiting, and sleeps only when the deque is empty: until the next ``put`` or, with a
    batch open, until that batch's one deadline (``batch_timeout`` after its first record).
    """

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
        self._items: deque[Any] = deque()  # records and markers, in order
        self._batch: list[dict[str, Any]] = []  # the open batch (kept while it is written)
        self._waiter: asyncio.Future[None] | None = None  # set while the task sleeps
        self._task: asyncio.Task[None] | None = None
        self._over_backlog = False
        #: While True, neither size nor timeout closes a batch: a segment is one batch.
        self.hold = False

    @property
    def pending(self) -> int:
        """Records waiting to be written (queued plus in the open batch)."""
        return len(self._items) + len(self._batch)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"writer:{self.result.job_code}")

    def put(self, record: dict[str, Any]) -> None:
        """Queue a processed record (never blocks: the pool's queue is the bound)."""
        self._items.append(record)
        self._queued()

    def put_many(self, records: Iterable[dict[str, Any]]) -> None:
        """Queue several records at once (one wake-up and one backlog check for all)."""
        self._items.extend(records)
        self._queued()

    def _queued(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            _wake(waiter)
        pending = len(self._items) + len(self._batch)
        if pending > self.backlog_limit:
            if not self._over_backlog:
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
        self._items.append(barrier)
        self._queued()
        return await barrier.done

    async def close(self) -> None:
        """Write everything queued, then stop."""
        if self._task is None:
            return
        self._items.append(_STOP)
        self._queued()
        await self._task
        self._task = None

    async def _sleep(self, timeout: float | None) -> None:
        """Until something is queued, or ``timeout`` seconds have passed."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(timeout, _wake, waiter) if timeout is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        items = self._items
        deadline = 0.0  # when the open batch goes out, whatever its size
        while True:
            # Time only moves at an await, so the deadline is checked once per wake-up,
            # not once per record.
            if self._batch and not self.hold:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    await self._write("timeout")
                    continue
                if not items:
                    await self._sleep(remaining)
                    continue
            elif not items:
                await self._sleep(None)
                continue
            batch = self._batch
            if not batch:
                deadline = loop.time() + self.batch_timeout
            size = self.batch_size
            while items:  # take what is there, without awaiting
                item = items.popleft()
                if isinstance(item, _Marker):
                    break
                batch.append(item)
                if len(batch) >= size and not self.hold:
                    await self._write("size")
                    break
            else:
                continue
            if item is _STOP:
                await self._write("final")
                return
            if isinstance(item, _Barrier):
                if item.drop:
                    self._drop(self._batch)
                    self._batch = []
                    ok = False
                else:
                    ok = await self._write("flush")
                if not item.done.done():
                    item.done.set_result(ok)

    async def _write(self, why: str) -> bool:
        """Hand the open batch to the sink; it counts as pending until the sink answers."""
        try:
            return await self._flush(self._batch, why)
        finally:
            self._batch = []

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

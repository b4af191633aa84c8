"""The processing pool: ``workers`` consumers of a bounded queue of fetched responses.

Each item goes through the job's ``process`` function (sync ones run in a thread pool so
CPU work never stalls the event loop); its records go to the writer. A full queue makes
``submit`` wait (backpressure on the scheduler) and logs a warning.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from crawlhub.fetch.http import Response
from crawlhub.fetch.joblog import JobLog
from crawlhub.pipeline.result import RunResult
from crawlhub.pipeline.writer import BatchWriter
from crawlhub.sinks.records import KIND_FIELD

#: ``process(item)`` returns records: an iterable of dicts, one dict, or None (nothing).
Process = Callable[[Any], Iterable[dict[str, Any]] | dict[str, Any] | None
                   | Awaitable[Iterable[dict[str, Any]] | dict[str, Any] | None]]

_STOP = object()
#: Seconds between two "queue full" warnings of one pool.
FULL_WARNING_EVERY = 10.0


def describe(item: Any) -> str:
    """A short name of an item for error logs: its URL, its id, or its repr."""
    if isinstance(item, Response):
        return item.request.url
    if isinstance(item, Mapping):
        for key in ("id", "_id", "key", "url"):
            if key in item:
                return f"{key}={item[key]!r}"
    text = repr(item)
    return text if len(text) <= 120 else text[:117] + "..."


class ProcessingPool:
    """``workers`` tasks over a queue of ``queue_size`` items. Callers: ``Pipeline``."""

    def __init__(
        self,
        process: Process,
        *,
        workers: int,
        queue_size: int,
        writer: BatchWriter,
        result: RunResult,
        log: JobLog,
        add_metadata: bool = True,
        record_kind: str | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"pipeline.workers must be >= 1, got {workers!r}")
        if queue_size < 1:
            raise ValueError(f"pipeline.queue_size must be >= 1, got {queue_size!r}")
        self.process = process
        self.workers = workers
        self.queue_size = queue_size
        self.writer = writer
        self.result = result
        self.log = log
        self.add_metadata = add_metadata
        #: set on every record (unless it has its own): sinks key by (kind, key)
        self.record_kind = record_kind
        self.active = 0
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=queue_size)
        self._tasks: list[asyncio.Task[None]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._is_async = inspect.iscoroutinefunction(process) or inspect.iscoroutinefunction(
            getattr(process, "__call__", None)  # noqa: B004 - async callables objects too
        )
        self._last_full_warning = -FULL_WARNING_EVERY

    @property
    def depth(self) -> int:
        """Items waiting for a worker."""
        return self._queue.qsize()

    def start(self) -> None:
        if not self._is_async:
            self._executor = ThreadPoolExecutor(
                max_workers=self.workers, thread_name_prefix=f"process-{self.result.job_code}"
            )
        for n in range(self.workers):
            self._tasks.append(
                asyncio.create_task(self._work(), name=f"worker{n}:{self.result.job_code}")
            )

    async def submit(self, item: Any) -> None:
        """Queue an item; wait while the queue is full (backpressure), with a warning."""
        if not self._queue.full():
            self._queue.put_nowait(item)
            return
        self.result.backpressure_waits += 1
        now = time.monotonic()
        if now - self._last_full_warning >= FULL_WARNING_EVERY:
            self._last_full_warning = now
            self.log.warning("processing queue full, scheduler waits (backpressure)",
                             queue_size=self.queue_size, active_workers=self.active,
                             hint="raise pipeline.workers or pipeline.queue_size")
        began = time.monotonic()
        await self._queue.put(item)
        self.result.add_time("backpressure", time.monotonic() - began)

    async def join(self) -> None:
        """Wait until every item submitted so far is processed (its records at the writer)."""
        await self._queue.join()

    async def close(self) -> None:
        """Process every queued item, then stop the workers."""
        for _ in self._tasks:
            await self._queue.put(_STOP)
        await asyncio.gather(*self._tasks)
        self._tasks.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            if item is _STOP:
                self._queue.task_done()
                return
            self.active += 1
            began = time.monotonic()
            try:
                records = await self._call(item)
            except Exception as exc:
                self.result.records_failed += 1
                self.result.add_error("process", item=describe(item),
                                      error=f"{type(exc).__name__}: {exc}")
                self.log.error("processing failed", item=describe(item),
                               error=f"{type(exc).__name__}: {exc}")
            else:
                self._emit(item, records)
            finally:
                self.active -= 1
                self.result.add_time("process", time.monotonic() - began)
                self._queue.task_done()

    async def _call(self, item: Any) -> list[Any]:
        if self._is_async:
            out = await self.process(item)  # type: ignore[misc]
            return _as_list(out)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _run_sync, self.process, item)

    def _emit(self, item: Any, records: list[Any]) -> None:
        """Hand an item's records to the writer in one go (not one call per record)."""
        meta: dict[str, Any] = {}
        if self.add_metadata and isinstance(item, Response):
            meta = {
                "source_endpoint": urlsplit(item.request.url).path or "/",
                "fetched_at": datetime.fromtimestamp(item.fetched_at, UTC).isoformat(),
            }
        good = records
        if not all(type(record) is dict for record in records):
            good = []
            for record in records:
                if isinstance(record, dict):
                    good.append(record)
                    continue
                self.result.records_failed += 1
                self.result.add_error("process", item=describe(item),
                                      error=f"record is a {type(record).__name__}, not a dict")
                self.log.error("processing failed", item=describe(item),
                               error=f"record is a {type(record).__name__}, not a dict")
        if self.record_kind is not None:
            meta[KIND_FIELD] = self.record_kind
        if meta:
            for record in good:
                for key, value in meta.items():
                    record.setdefault(key, value)
        self.result.records_processed += len(good)
        self.writer.put_many(good)


def _run_sync(process: Process, item: Any) -> list[Any]:
    return _as_list(process(item))


def _as_list(out: Any) -> list[Any]:
    if out is None:
        return []
    if isinstance(out, dict):
        return [out]
    return list(out)

"""A run's job log lines, shipped to the metadata store so every process can read them.

The API of one process shows the log of a run started from the CLI of another: lines
are buffered in memory and appended every ``interval`` seconds (and at the end of the
run) to the store, which keeps the newest ``keep`` lines per job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from types import TracebackType
from typing import Any

from crawlhub.collect.store.base import MetadataStore
from crawlhub.fetch.joblog import JobLog

#: Log lines the metadata store keeps per job.
DEFAULT_LOG_KEEP = 5000

_std = logging.getLogger("crawlhub.collect")


class StoredLog:
    """``async with StoredLog(store, log):`` ships the lines ``log`` gets meanwhile.

    Costs one multi-row insert (plus a bounded trim) per ``interval`` while lines come;
    a store outage drops the lines of that interval (they stay in the process's ring
    buffer and the standard log) and is reported once through ``logging``.
    """

    def __init__(
        self, store: MetadataStore, log: JobLog, *, keep: int = DEFAULT_LOG_KEEP,
        interval: float = 0.5,
    ) -> None:
        self.store = store
        self.log = log
        self.keep = keep
        self.interval = interval
        self._buffer: deque[dict[str, Any]] = deque(maxlen=max(1, keep))
        self._unsubscribe: Any = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def __aenter__(self) -> StoredLog:
        self._unsubscribe = self.log.subscribe(self._buffer.append)
        self._task = asyncio.create_task(self._loop(), name=f"joblog:{self.log.job_code}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def flush(self) -> None:
        """Append the buffered lines to the store now."""
        lines = []
        while self._buffer:
            lines.append(self._buffer.popleft())
        if not lines:
            return
        try:
            await self.store.append_log(self.log.job_code, lines, keep=self.keep)
        except Exception as exc:  # never let the log stop the run
            if not self._failing:
                _std.warning("job %s: log lines not saved to the metadata store: %s",
                             self.log.job_code, exc)
            self._failing = True
        else:
            self._failing = False

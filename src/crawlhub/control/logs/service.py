"""The log service of one process: the store, the transport that fills it, the handler
that ships this process's own logs, live tails and retention (``ControlPlane.logs``).

    logs = await LogService.open(config)          # store + transport from ``control``
    await logs.start()                            # flush task, collector, pruner, handler
    await logs.write([LogLine(ts, "GET /a 200", job="j", run="r1", task="t1")])
    logs.emit("build done", source="build", job="j")
    page = await logs.search(LogQuery(job="j", q="timeout", level="warning"))
    async for line in logs.tail(LogQuery(job="j")): ...
    await logs.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from crawlhub.control.db import ControlDB
from crawlhub.control.logs import handler as shipping
from crawlhub.control.logs.line import LogLine
from crawlhub.control.logs.open import open_log_store
from crawlhub.control.logs.store import LogPage, LogStore
from crawlhub.control.logs.text import LogQuery, clean_line
from crawlhub.control.logs.transport import (
    DirectTransport,
    LogCollector,
    LogTransport,
    RedisTransport,
)
from crawlhub.core.redact import redact_text

if TYPE_CHECKING:
    from crawlhub.config.schema import CrawlhubConfig

log = logging.getLogger("crawlhub.control.logs")

#: Seconds between two looks at the store for a tail (lines written in this process wake
#: tails at once).
POLL = 0.3
#: Lines read per look of a tail.
TAIL_BATCH = 500
#: Seconds between two prunes.
PRUNE_EVERY = 300.0
HOST = socket.gethostname()


class LogService:
    """Store + transport (+ collector) of one process; see the module docstring.

    ``max_age`` / ``max_lines``: retention applied every ``prune_every`` seconds once
    started (None: not by that measure).
    """

    def __init__(self, store: LogStore, transport: LogTransport | None = None, *,
                 collector: LogCollector | None = None, max_age: float | None = None,
                 max_lines: int | None = None, prune_every: float = PRUNE_EVERY,
                 poll: float = POLL) -> None:
        self.store = store
        self.transport = transport or DirectTransport(store)
        if isinstance(self.transport, DirectTransport) and self.transport.written is None:
            self.transport.written = self._notify
        self.collector = collector
        if collector is not None and collector.written is None:
            collector.written = self._notify
        self.max_age = max_age
        self.max_lines = max_lines
        self.prune_every = prune_every
        self.poll = poll
        self.pruned = 0
        self._new = asyncio.Event()
        self._handler: shipping.LogShipper | None = None
        self._handler_logger = "crawlhub"
        self._tasks: list[asyncio.Task[Any]] = []
        self._started = False

    @classmethod
    async def open(cls, config: CrawlhubConfig, *, prefix: str = "crawlhub_",
                   redis_prefix: str | None = None) -> LogService:
        """The service of ``config.control``: the store on ``logs_url`` (tables named
        with ``prefix``), the Redis transport and a collector when ``channel`` is a
        Redis URL (stream key under ``redis_prefix``, default ``storage.redis_prefix``),
        else (unset or ``memory://``, as for the control channel) direct writes."""
        section = config.control
        store = open_log_store(await ControlDB.open(section.logs_url, prefix=prefix))
        try:
            await store.open()
            transport: LogTransport
            collector = None
            channel = section.channel
            if channel and not channel.lower().startswith("memory://"):
                from crawlhub.backends.redis import redis_client
                from crawlhub.core.keys import log_keys

                key = log_keys(redis_prefix if redis_prefix is not None
                               else config.storage.redis_prefix)["stream"]
                transport = RedisTransport(redis_client(channel, name="log transport"), key)
                collector = LogCollector(redis_client(channel, name="log collector"), key,
                                         store)
            else:
                transport = DirectTransport(store)
        except BaseException:
            await store.close()
            raise
        return cls(store, transport, collector=collector, max_age=section.log_max_age,
                   max_lines=section.log_max_lines)

    # -- life -----------------------------------------------------------------------------
    async def start(self, *, collect: bool = True, prune: bool = True,
                    ship: bool = True) -> None:
        """Start the flush task; with ``collect`` the collector (distributed), with
        ``prune`` the pruner, with ``ship`` the handler of ``crawlhub.*`` loggers."""
        if self._started:
            return
        self._started = True
        await self.transport.start()
        if collect and self.collector is not None:
            self.collector.start()  # stopped by its close(), between two rounds
        if prune and (self.max_age is not None or self.max_lines is not None):
            self._tasks.append(asyncio.create_task(self._prune_forever(),
                                                   name="crawlhub-logs-pruner"))
        if ship:
            self.install_handler()

    def install_handler(self, logger: str = "crawlhub",
                        level: int = logging.NOTSET) -> shipping.LogShipper:
        """Ship the records of ``logger`` and its children (once; removed by
        :meth:`close`)."""
        if self._handler is None:
            self._handler = shipping.install(self.transport.put, logger=logger, level=level)
            self._handler_logger = logger
        return self._handler

    async def close(self) -> None:
        """Remove the handler, stop the pruner and collector, flush (a few seconds at
        most), close the store."""
        if self._handler is not None:
            shipping.uninstall(self._handler, logger=self._handler_logger)
            self._handler = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.transport.close()
        if self.collector is not None:
            await self.collector.close()
        await self.store.close()

    # -- writing --------------------------------------------------------------------------
    def lines_in(self, lines: Iterable[LogLine]) -> list[LogLine]:
        """``lines`` cleaned (:func:`~crawlhub.control.logs.text.clean_line`) with
        secrets masked in the messages; a line without a host gets this one's."""
        out = []
        for line in lines:
            clean = clean_line(line)
            clean.message = redact_text(clean.message)
            clean.host = clean.host or HOST
            out.append(clean)
        return out

    async def write(self, lines: Iterable[LogLine]) -> None:
        """Queue lines for the store: cleaned, secrets masked, then sent within about
        0.2 s (:meth:`flush` to wait). Waits while the transport's buffer is half full
        (a job printing faster than the store writes is slowed, not cut), at most
        ``patience`` seconds while nothing is sent; never raises for an outage (the
        transport buffers, and counts what it must drop). Matches the job runner's
        ``log_sink``."""
        await self.transport.put_wait(self.lines_in(lines))

    def dropped_of(self, run: str) -> int:
        """Lines of run ``run`` this process had to drop (its buffer full while the store
        or Redis was away, or unsent at close). Matches the job runner's
        ``log_dropped``."""
        return self.transport.buffer.dropped_of(run)

    def emit(self, message: str, *, level: str = "info", source: str = "control",
             job: str | None = None, run: str | None = None, task: str | None = None,
             stream: str | None = None, host: str | None = None,
             ts: float | None = None) -> None:
        """One line, like :meth:`write`, from synchronous code (any thread)."""
        self.transport.put(self.lines_in([LogLine(
            ts=time.time() if ts is None else ts, message=message, level=level,
            source=source, job=job, run=run, task=task, host=host or "", stream=stream)]))

    async def flush(self, timeout: float = 10.0) -> None:
        """Send what is buffered now. Embedded, the lines are then searchable; through
        Redis they are in the stream (a collector stores them shortly)."""
        await self.transport.flush(timeout)

    def _notify(self, n: int = 0) -> None:
        """Lines were stored in this process: wake the tails."""
        event, self._new = self._new, asyncio.Event()
        event.set()

    # -- reading --------------------------------------------------------------------------
    async def search(self, query: LogQuery) -> LogPage:
        """A page of lines matching ``query`` (newest first; oldest first with
        ``after``)."""
        return await self.store.search(query)

    async def wait_lines(self, query: LogQuery, after: int, timeout: float) -> list[LogLine]:
        """Lines matching ``query`` with an id over ``after``, oldest first (at most
        :data:`TAIL_BATCH`), as soon as there are any; ``[]`` after ``timeout`` seconds.
        Cost: one store search per :data:`POLL` seconds while nothing comes."""
        forward = replace(query, before=None, after=after, limit=TAIL_BATCH)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            waiter = self._new
            page = await self.store.search(forward)
            if page.lines:
                return page.lines
            left = deadline - loop.time()
            if left <= 0:
                return []
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), min(self.poll, left))

    async def tail(self, query: LogQuery, *, after: int | None = None
                   ) -> AsyncIterator[LogLine]:
        """Every new line matching ``query``, oldest first, forever: from the id after
        ``after``, or from the lines stored from now on."""
        cursor = await self.store.last_id() if after is None else after
        while True:
            for line in await self.wait_lines(query, cursor, 3600.0):
                if line.id is not None:
                    cursor = line.id
                yield line

    # -- retention ------------------------------------------------------------------------
    async def prune(self, *, max_age: float | None = None, max_lines: int | None = None
                    ) -> int:
        """Apply retention now (by default the configured one); lines deleted."""
        removed = await self.store.prune(
            max_age=self.max_age if max_age is None else max_age,
            max_lines=self.max_lines if max_lines is None else max_lines)
        self.pruned += removed
        return removed

    async def _prune_forever(self) -> None:
        while True:
            try:
                removed = await self.prune()
                if removed:
                    log.info("log retention deleted %d lines", removed)
            except Exception as exc:  # noqa: BLE001 - the store down: next time
                log.warning("log retention failed: %s; trying again in %g s", exc,
                            self.prune_every)
            await asyncio.sleep(self.prune_every)

    def metrics_text(self) -> str:
        """This process's log figures in Prometheus' text format (``GET /metrics``):
        lines sent, dropped (a bound hit while the store was away), buffered, and the
        times a job's output waited for room (the job slowed, nothing lost)."""
        t = self.transport
        figures = [
            ("crawlhub_log_lines_sent_total", "counter",
             "Log lines this process sent to the log store (or its Redis stream).", t.sent),
            ("crawlhub_log_lines_dropped_total", "counter",
             "Log lines this process dropped: its buffer was full while the log store"
             " was out of reach (a run's own count is its log_dropped).",
             t.buffer.dropped),
            ("crawlhub_log_lines_buffered", "gauge",
             "Log lines waiting in this process to be sent.", len(t.buffer)),
            ("crawlhub_log_producer_waits_total", "counter",
             "Times a job's output waited for room in the log buffer (the job was"
             " slowed; nothing was lost).", t.waits),
        ]
        out = []
        for name, kind, text, value in figures:
            out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(out) + "\n"

    def stats(self) -> dict[str, Any]:
        """The transport's, the collector's and the handler's counters."""
        out: dict[str, Any] = {"store": self.store.name, **self.transport.stats(),
                               "pruned": self.pruned}
        if self.collector is not None:
            out["collector"] = self.collector.stats()
        if self._handler is not None:
            out["shipped"] = self._handler.shipped
        return out


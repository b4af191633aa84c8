"""How log lines reach the store: producers put lines in a bounded buffer (any thread,
never blocking); a flush task sends them on every 0.2 s or every :data:`BATCH` lines.

- embedded (``control.channel`` unset): :class:`DirectTransport` writes each batch to the
  store in this process;
- distributed (``control.channel: redis://...``): :class:`RedisTransport` appends each
  batch as one entry to a Redis stream (``keys.log_keys``), and a :class:`LogCollector`
  (in every ``crawlhub serve``) reads the stream in a consumer group, writes the lines to
  the store, then acknowledges: a collector killed mid-batch loses nothing (its entries
  stay pending and are claimed by another collector, or by itself on restart), and the
  store's ``uid`` per line (``<entry id>/<n>``) keeps redelivered lines from doubling.

A producer that can wait (a job's output: :meth:`LogTransport.put_wait`) waits while the
buffer is over half full, so a job printing faster than the store writes is slowed (its
pipe fills) and loses nothing; it waits as long as lines are being sent, and gives up after
:data:`PATIENCE` seconds without a batch sent (the store or Redis away). A full buffer drops
its *oldest* lines and counts them (``dropped``, and per run: :meth:`LineBuffer.dropped_of`);
a store or Redis out of reach keeps the lines buffered and retries with backoff. Nothing
here raises into a producer, and :meth:`LogTransport.put` never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from crawlhub.control.logs.line import LogLine
from crawlhub.control.logs.store import LogStore
from crawlhub.control.logs.text import clean_line
from crawlhub.core import keys, rejects

log = logging.getLogger("crawlhub.control.logs")

#: Lines per store write or stream entry.
BATCH = 500
#: Seconds between flushes when fewer than :data:`BATCH` lines wait.
INTERVAL = 0.2
#: Lines a producer buffers at most (then the oldest go, counted).
CAPACITY = 100_000
#: Seconds a waiting producer (:meth:`LogTransport.put_wait`) waits for room while no batch
#: is sent (the store or Redis away); then its lines go in, and the oldest are dropped.
PATIENCE = 30.0
#: Seconds to wait after a failed send, doubling up to :data:`MAX_BACKOFF`.
BACKOFF = 0.2
MAX_BACKOFF = 5.0
#: Stream entries waiting at most (about ``STREAM_MAXLEN * BATCH`` lines) while no
#: collector reads: beyond it a producer holds its lines (a send fails, retried), so the
#: stream is never trimmed of lines no one stored.
STREAM_MAXLEN = 20_000
#: The collectors' consumer group.
GROUP = "collectors"

Written = Callable[[int], None]


def next_backoff(previous: float) -> float:
    """The wait after another failed send or round: :data:`BACKOFF`, then doubling up
    to :data:`MAX_BACKOFF`."""
    return min(MAX_BACKOFF, max(BACKOFF, previous * 2))


class LineBuffer:
    """A bounded FIFO of ``(line, uid)`` shared by threads; full, it drops the oldest and
    counts them in ``dropped`` (and per run in :meth:`dropped_of`). Every method is
    O(lines moved) under one lock."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self.dropped = 0
        #: run code -> lines of that run dropped
        self.dropped_runs: dict[str, int] = {}
        self._items: deque[tuple[LogLine, str | None]] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def dropped_of(self, run: str) -> int:
        """Lines of run ``run`` this buffer dropped."""
        return self.dropped_runs.get(run, 0)

    def _count_dropped(self, items: Iterable[tuple[LogLine, str | None]]) -> None:
        """(under the lock)"""
        for line, _ in items:
            self.dropped += 1
            if line.run:
                self.dropped_runs[line.run] = self.dropped_runs.get(line.run, 0) + 1

    def put(self, items: Iterable[tuple[LogLine, str | None]]) -> int:
        """Append; returns the buffer's length after."""
        with self._lock:
            self._items.extend(items)
            over = len(self._items) - self.capacity
            if over > 0:
                self._count_dropped([self._items.popleft() for _ in range(over)])
            return len(self._items)

    def drop_all(self) -> int:
        """Drop every line (counted); how many."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._count_dropped(items)
            return len(items)

    def take(self, n: int) -> list[tuple[LogLine, str | None]]:
        with self._lock:
            return [self._items.popleft() for _ in range(min(n, len(self._items)))]

    def put_back(self, items: Sequence[tuple[LogLine, str | None]]) -> None:
        """Return a batch that could not be sent to the front (oldest first); what no
        longer fits is dropped from that batch's oldest end, counted."""
        with self._lock:
            room = max(0, self.capacity - len(self._items))
            cut = max(0, len(items) - room)
            self._count_dropped(items[:cut])
            self._items.extendleft(reversed(items[cut:]))


class LogTransport:
    """The producer side: :meth:`put` from anywhere; a task started by :meth:`start`
    flushes. Subclasses send a batch with :meth:`_send`."""

    kind = "transport"

    def __init__(self, *, capacity: int = CAPACITY, batch: int = BATCH,
                 interval: float = INTERVAL, patience: float = PATIENCE) -> None:
        self.buffer = LineBuffer(capacity)
        self.batch = batch
        self.interval = interval
        self.patience = patience
        #: a waiting producer puts once the buffer holds fewer lines than this
        self.room_below = max(1, capacity // 2)
        #: times a producer waited for room (the job was slowed), and lines it then put
        #: without room after :attr:`patience` s with nothing sent
        self.waits = 0
        self.gave_up = 0
        self.sent = 0
        self.failures = 0
        self.last_error: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._send_lock: asyncio.Lock | None = None
        self._backoff = 0.0
        self._down = False
        self._in_flight = 0
        self._stopping = False
        self._sent_event: asyncio.Event | None = None

    # -- producers ----------------------------------------------------------------------
    async def put_wait(self, lines: Iterable[LogLine],
                       uids: Iterable[str | None] | None = None) -> None:
        """:meth:`put`, after waiting while the buffer is at least half full (from the
        flush task's loop): a producer that can wait is slowed to the store's pace
        instead of losing lines. It waits as long as batches are being sent; after
        :attr:`patience` seconds without one (the store away) the lines go in anyway,
        and a full buffer drops its oldest, counted."""
        if (self._task is not None and len(self.buffer) >= self.room_below
                and threading.get_ident() == self._loop_thread):
            self.waits += 1
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.patience
            sent = self.sent
            while len(self.buffer) >= self.room_below and not self._stopping:
                if self.sent != sent:  # progress: the store takes lines, keep waiting
                    sent, deadline = self.sent, loop.time() + self.patience
                left = deadline - loop.time()
                if left <= 0:
                    self.gave_up += 1
                    log.warning("log %s: no batch sent for %g s with %d lines waiting;"
                                " the oldest lines are dropped (counted) while it lasts",
                                self.kind, self.patience, len(self.buffer))
                    break
                if self._sent_event is None:
                    self._sent_event = asyncio.Event()
                assert self._wake is not None
                self._wake.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._sent_event.wait(), min(left, 1.0))
        self.put(lines, uids)

    def put(self, lines: Iterable[LogLine], uids: Iterable[str | None] | None = None) -> None:
        """Queue lines (already cleaned); returns at once, from any thread."""
        items = list(zip(lines, uids, strict=True)) if uids is not None \
            else [(line, None) for line in lines]
        if not items:
            return
        size = self.buffer.put(items)
        if size >= self.batch and self._loop is not None and self._wake is not None:
            if threading.get_ident() == self._loop_thread:
                self._wake.set()
            else:
                with contextlib.suppress(RuntimeError):  # the loop is closing
                    self._loop.call_soon_threadsafe(self._wake.set)

    # -- the flush task -----------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"crawlhub-logs-{self.kind}")

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval + self._backoff)
            self._wake.clear()
            try:
                await self._drain()
            except Exception:  # noqa: BLE001 - _failed logged it; wait, then retry
                await asyncio.sleep(self._backoff)

    async def _drain(self) -> None:
        """Send batches until the buffer is empty; on a failure keep the batch and
        raise (the flush task waits a backoff, :meth:`flush` reports it)."""
        if self._send_lock is None:
            self._send_lock = asyncio.Lock()
        async with self._send_lock:
            while batch := self.buffer.take(self.batch):
                self._in_flight = len(batch)
                try:
                    await self._send(batch)
                except BaseException as exc:
                    self.buffer.put_back(batch)
                    if isinstance(exc, Exception):
                        self._failed(exc)
                    raise
                finally:
                    self._in_flight = 0
                self.sent += len(batch)
                event, self._sent_event = self._sent_event, None
                if event is not None:  # producers waiting for room look again
                    event.set()
                if self._down:
                    self._down = False
                    self._backoff = 0.0
                    log.warning("log %s works again; %d lines were dropped meanwhile",
                                self.kind, self.buffer.dropped)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self._backoff = next_backoff(self._backoff)
        if not self._down:
            self._down = True
            log.warning("log %s failed (%s); %d lines kept, retrying with backoff",
                        self.kind, self.last_error, len(self.buffer))

    async def flush(self, timeout: float = 10.0) -> None:
        """Send everything buffered now; raises the send's error (lines stay buffered),
        or TimeoutError after ``timeout`` seconds."""
        await asyncio.wait_for(self._drain(), timeout)

    async def close(self, timeout: float = 3.0) -> None:
        """Stop the flush task after a last flush of at most ``timeout`` seconds; what
        is still buffered then is dropped, counted and logged."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            assert self._wake is not None
            self._wake.set()
            # Let the flush task end by itself: a send cancelled half-way through a
            # Redis call may leave the client's connection in doubt.
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
        try:
            await self.flush(timeout)
        except Exception as exc:  # noqa: BLE001 - closing: report, do not raise
            left = self.buffer.drop_all()
            if left:
                log.warning("log %s closed with %d lines unsent (%s)", self.kind, left, exc)
        await self._close()

    async def _close(self) -> None:
        """Release the transport's own connections."""

    async def _send(self, batch: list[tuple[LogLine, str | None]]) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """``buffered`` (not yet sent, the batch being sent included), ``sent``,
        ``dropped`` (lines lost to a full buffer), ``waits`` (a producer slowed for room),
        ``failures`` (sends failed) and ``last_error``."""
        return {"transport": self.kind, "buffered": len(self.buffer) + self._in_flight,
                "sent": self.sent,
                "dropped": self.buffer.dropped, "waits": self.waits,
                "failures": self.failures, "last_error": self.last_error}


class DirectTransport(LogTransport):
    """Embedded: each batch is one store write in this process; ``written(n)`` is called
    after it (tails wake up)."""

    kind = "direct"

    def __init__(self, store: LogStore, *, written: Written | None = None,
                 **options: Any) -> None:
        super().__init__(**options)
        self.store = store
        self.written = written

    async def _send(self, batch: list[tuple[LogLine, str | None]]) -> None:
        uids = [u for _, u in batch]
        n = await self.store.write([line for line, _ in batch],
                                   uids if any(u is not None for u in uids) else None)
        if self.written is not None:
            self.written(n)


# -- Redis ------------------------------------------------------------------------------
def encode_batch(lines: Sequence[LogLine]) -> str:
    """A batch as one stream field: a JSON array of ``[ts, level, source, job, run, task,
    host, stream, message]``."""
    return json.dumps([[line.ts, line.level, line.source, line.job, line.run, line.task,
                        line.host, line.stream, line.message] for line in lines],
                      ensure_ascii=False, separators=(",", ":"))


def decode_batch(text: str | bytes) -> list[LogLine]:
    """The lines of :func:`encode_batch`; ValueError when it is not such a batch."""
    rows = json.loads(text)
    if not isinstance(rows, list):
        raise ValueError("a log batch is a JSON array")
    lines = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 9:
            raise ValueError("a log line in a batch is an array of 9 fields")
        ts, level, source, job, run, task, host, stream, message = row
        lines.append(LogLine(ts=float(ts), message=str(message), level=str(level),
                             source=str(source), job=job, run=run, task=task,
                             host=str(host or ""), stream=stream))
    return lines


class RedisTransport(LogTransport):
    """Distributed: each batch is one ``XADD`` to the stream ``key``, unless the stream
    already holds ``maxlen`` entries no collector took (then the send fails and the lines
    stay buffered: nothing is trimmed away unstored). Cost: one round trip per batch (a
    script: the length check and the append together, so any number of producers keep
    the bound). ``client`` is a redis.asyncio client
    (:func:`crawlhub.backends.redis.redis_client`), closed with the transport."""

    kind = "redis stream"

    def __init__(self, client: Any, key: str, *, maxlen: int = STREAM_MAXLEN,
                 **options: Any) -> None:
        super().__init__(**options)
        self.client = client
        self.key = key
        self.maxlen = maxlen
        from crawlhub.backends.redis import lua  # (distributed mode only)

        self._append = client.register_script(lua(__package__, "bounded_xadd.lua"))

    async def _send(self, batch: list[tuple[LogLine, str | None]]) -> None:
        n = int(await self._append(keys=[self.key], args=[
            self.maxlen, encode_batch([line for line, _ in batch])]))
        if n < 0:
            raise StreamFull(f"log stream {self.key!r} holds {-1 - n} batches no collector"
                             f" has stored (the bound is {self.maxlen}); is a 'crawlhub"
                             " serve' with the same control.channel running?")

    async def _close(self) -> None:
        await self.client.aclose()


def _prefix_of(key: str) -> str:
    """The key prefix of a log stream named by :func:`crawlhub.core.keys.log_keys`."""
    stem = keys.log_keys("")["stream"]
    return key[: -len(stem)] if key.endswith(stem) else f"{key}:"


class StreamFull(RuntimeError):
    """The log stream holds :data:`STREAM_MAXLEN` unstored batches: the producer waits."""


def consumer_name() -> str:
    """This collector's name in the consumer group: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LogCollector:
    """Moves lines from the stream to the store (distributed mode); one per
    ``crawlhub serve``, any number side by side in the consumer group.

    A round: claim entries pending over ``claim_idle`` seconds at another (dead)
    collector (``XAUTOCLAIM``), every ``claim_every`` seconds; read new entries
    (``XREADGROUP``, blocking up to ``block`` seconds); write their lines in one store
    write, each with the uid ``<entry id>/<n>``; then ``XACK`` + ``XDEL`` them. Entries
    read but not acked (the store down, this process killed) are read again from this
    consumer's own pending list first. Cost: 3 Redis round trips and one store
    transaction per round of up to ``count`` entries.
    """

    def __init__(self, client: Any, key: str, store: LogStore, *,
                 group: str = GROUP, consumer: str | None = None, count: int = 20,
                 block: float = 1.0, claim_idle: float = 30.0, claim_every: float = 5.0,
                 written: Written | None = None, dead_key: str | None = None) -> None:
        self.client = client
        self.key = key
        self.store = store
        self.group = group
        self.consumer = consumer or consumer_name()
        self.count = count
        self.block = block
        self.claim_idle = claim_idle
        self.claim_every = claim_every
        self.written = written
        #: where rejected entries are kept (keys.dead_stream): beside the stream's prefix
        self.dead_key = dead_key or keys.dead_stream(_prefix_of(key), "logs")
        self.stored = 0
        self.entries = 0
        self.claimed = 0
        self.bad = 0
        self.last_error: str | None = None
        self._own_pending = True  # read this consumer's unacked entries first
        self._next_claim = 0.0
        self._group_ready = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            await self.client.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except Exception as exc:  # noqa: BLE001 - BUSYGROUP: it exists, which is fine
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def step(self) -> int:
        """One round (see the class docstring); the number of lines newly stored.
        Raises when Redis or the store fails (nothing is acked then)."""
        try:
            return await self._round()
        except Exception as exc:
            if "NOGROUP" not in str(exc):
                raise
        # Redis came back empty (no persistence): make the group again, then read.
        self._group_ready = False
        return await self._round()

    async def _round(self) -> int:
        await self.ensure_group()
        stored = 0
        now = time.monotonic()
        if now >= self._next_claim:
            self._next_claim = now + self.claim_every
            stored += await self._claim()
        # Own pending entries ("0") come back at once; new ones (">") are waited for.
        own = self._own_pending
        reply = await self.client.xreadgroup(
            self.group, self.consumer, {self.key: "0" if own else ">"}, count=self.count,
            block=None if own else max(1, int(self.block * 1000)))
        entries = reply[0][1] if reply else []
        if own and not entries:
            self._own_pending = False
        return stored + await self._store(entries)

    async def _claim(self) -> int:
        stored = 0
        start: Any = "0-0"
        while True:
            reply = await self.client.xautoclaim(self.key, self.group, self.consumer,
                                                 int(self.claim_idle * 1000), start,
                                                 count=self.count)
            start, entries = reply[0], reply[1]
            gone = reply[2] if len(reply) > 2 else []
            if gone:  # trimmed before anyone stored them: nothing left to do
                await self.client.xack(self.key, self.group, *gone)
            if entries:
                self.claimed += len(entries)
                stored += await self._store(entries)
            if start in (b"0-0", "0-0") or not entries:
                return stored

    async def _store(self, entries: list[Any]) -> int:
        if not entries:
            return 0
        lines: list[LogLine] = []
        uids: list[str | None] = []
        done = []
        bad: list[tuple[str, str, Any]] = []
        for entry_id, fields in entries:
            name = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            done.append(entry_id)
            if not fields:  # deleted after delivery (trimmed): nothing to store
                continue
            raw = fields.get(b"lines", fields.get("lines"))
            try:
                if raw is None:
                    raise ValueError("no field 'lines'")
                batch = [clean_line(line) for line in decode_batch(raw)]
            except (ValueError, TypeError, RecursionError) as exc:
                # acked with the others below, counted, logged once, kept aside
                self.bad += 1
                bad.append((name, f"not a batch of log lines ({exc})", fields))
                continue
            for n, line in enumerate(batch):
                lines.append(line)
                uids.append(f"{name}/{n}")
        new = await self.store.write(lines, uids)
        # Stored: now the entries may go. A crash before this line redelivers them,
        # and the uids keep the store from doubling them.
        async with self.client.pipeline(transaction=False) as pipe:
            for name, detail, fields in bad:
                rejects.rejected("logs", name, rejects.MALFORMED, f"{self.key}: {detail}",
                                 dead=self.dead_key)
                rejects.xadd_dead(pipe, self.dead_key, rejects.dead_fields(
                    self.key, name, rejects.MALFORMED, detail, fields))
            pipe.xack(self.key, self.group, *done)
            pipe.xdel(self.key, *done)
            await pipe.execute()
        self.entries += len(done)
        self.stored += new
        if new and self.written is not None:
            self.written(new)
        return new

    async def run(self) -> None:
        """Rounds until :meth:`close`; a failure is logged once per outage and retried
        with backoff (entries read stay pending and are read again)."""
        backoff = 0.0
        while not self._stopping:
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - Redis or the store down: retry
                self._own_pending = True
                error = f"{type(exc).__name__}: {exc}"
                if self.last_error is None:
                    log.warning("log collector %s: %s; retrying with backoff",
                                self.consumer, error)
                self.last_error = error
                backoff = next_backoff(backoff)
                await asyncio.sleep(backoff)
                continue
            if self.last_error is not None:
                log.warning("log collector %s works again", self.consumer)
                self.last_error = None
            backoff = 0.0

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="crawlhub-log-collector")
        return self._task

    async def close(self) -> None:
        """Stop between two rounds (a round ends within ``block`` seconds), so nothing
        is left half done; cancel only a round stuck past that; close the client."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=self.block + 2.0)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=2.0)
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.warning("log collector %s ended with %r", self.consumer,
                            task.exception())
        await self.client.aclose()

    def stats(self) -> dict[str, Any]:
        return {"consumer": self.consumer, "stored": self.stored, "entries": self.entries,
                "claimed": self.claimed, "bad": self.bad, "last_error": self.last_error}


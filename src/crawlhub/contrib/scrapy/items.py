"""``ITEM_PIPELINES = {"crawlhub.contrib.scrapy.ItemSink": 900}``: items committed to a
crawlhub sink before the requests that produced them count as finished.

In a Scrapy project's settings (or with ``-s`` on the command line)::

    ITEM_PIPELINES = {"crawlhub.contrib.scrapy.ItemSink": 900}
    CRAWLHUB_ITEMS = "items.db"          # SQLite; or "items.jsonl", or a sink mapping:
    CRAWLHUB_ITEMS = {"type": "postgres", "url": "postgresql://...", "table": "items",
                      "key": "url"}

==========================  ==========================================================
``CRAWLHUB_ITEMS``          where items go: a path ending ``.db``/``.sqlite`` (the
                            SQLite sink, shared by the spiders of one machine), one
                            ending ``.jsonl`` (JSON lines; one process per file: a
                            second one is refused), or a
                            crawlhub ``sink:`` mapping (``type``: ``sqlite``,
                            ``jsonl``, ``postgres``, ``redis_stream``, ``kafka``), as a
                            dict or JSON text
``CRAWLHUB_ITEMS_KEY``      the item fields that identify an item (default ``url``; a
                            mapping's own ``key`` wins): an item written again after a
                            kill replaces its row, never doubles it
``CRAWLHUB_ITEMS_BATCH``    items per write at most (default 500)
==========================  ==========================================================

The guarantee. ``process_item`` returns only once the item's batch is committed (the
sink's transaction, an fsync'd JSON lines append, a broker acknowledgement). Scrapy
finishes a request (the engine's ``remove_request``) only after every item of its
callback went through the pipelines, and crawlhub's scheduler checks besides that
every item the pipeline received before a request finished is committed (a watermark,
:meth:`ItemSink.committed_through`) before it finishes the request in the frontier. A
spider killed with SIGKILL loses its uncommitted items together with its unfinished
requests: the requests go to another spider, which produces the items again, and the
sink keys them, so the output holds each item once. Scrapy's own ``-o items.jsonl``
feed has no such tie: what its buffer held when the process died is gone while the
requests count as done.

Items are written by a thread of their own (a sink's write may block: a file, SQLite).
Under the asyncio reactor (Scrapy's default) the items of one turn of the engine's loop
cross to that thread together and return together once the last of them is committed:
one hand-off each way per group, not per item.

Writes are retried while the sink is unreachable (logged once, and once when it answers
again); the spider keeps crawling and its requests stay unfinished until their items
are written. An item the sink can never take (no key field, a value JSON cannot hold)
is dropped with an error naming the fix (``item_sink/refused``).

Stats: ``item_sink/written`` (rows inserted or changed), ``item_sink/unchanged`` (a row
already held the same item), ``item_sink/batches``, ``item_sink/refused``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crawlhub.contrib.scrapy.loop import LoopThread, engine_wait, running_engine_loop
from crawlhub.contrib.scrapy.settings import _error, _int
from crawlhub.core.errors import ConfigError, SinkError
from crawlhub.sinks.records import Preparer

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from crawlhub.sinks.base import Sink

log = logging.getLogger("crawlhub.contrib.scrapy.items")

#: Seconds between write attempts while the sink fails.
BACKOFF = 1.0
#: Seconds ``close_spider`` keeps trying to write what is left.
CLOSE_TIMEOUT = 30.0

_OPEN: weakref.WeakKeyDictionary[Any, ItemSink] = weakref.WeakKeyDictionary()


def sink_spec(value: Any, key: Any = None) -> dict[str, Any]:
    """The sink mapping of a ``CRAWLHUB_ITEMS`` value (a path or a mapping)."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            raise _error("CRAWLHUB_ITEMS", f"{value!r:.80} is not a JSON object") from None
    if isinstance(value, Mapping):
        spec = dict(value)
    elif isinstance(value, str | Path) and str(value).strip():
        path = Path(str(value).strip()).expanduser()
        if path.suffix in (".db", ".sqlite", ".sqlite3"):
            spec = {"type": "sqlite", "path": str(path)}
        elif path.suffix in (".jsonl", ".jl"):
            spec = {"type": "jsonl", "path": str(path)}
        else:
            raise _error("CRAWLHUB_ITEMS", f"{value!r}: give a file ending .db (SQLite) or"
                         " .jsonl (JSON lines), or a sink mapping such as {\"type\":"
                         " \"postgres\", \"url\": ..., \"table\": ...}")
    else:
        raise _error("CRAWLHUB_ITEMS", "not set: name where items go (items.db, items.jsonl"
                     " or a sink mapping)")
    spec.setdefault("name", "items")
    if "key" not in spec:
        spec["key"] = key or "url"
    return spec


class ItemSink:
    """The item pipeline; see the module docstring."""

    def __init__(self, crawler: Crawler, spec: dict[str, Any], *, batch: int = 500) -> None:
        from crawlhub.sinks.config import build_sink

        self.crawler = crawler
        self.stats = crawler.stats
        self.spec = spec
        self.batch_max = batch
        try:
            self.sink: Sink = build_sink(spec, name="items", entry="Scrapy setting CRAWLHUB_ITEMS")
        except ConfigError as exc:
            raise _error("CRAWLHUB_ITEMS", str(exc)) from None
        keys = spec["key"]
        self._preparer = Preparer([keys] if isinstance(keys, str) else list(keys),
                                  sink=self.sink.name)
        self.loop: LoopThread | None = None
        #: items handed to the sink (reactor thread) and committed in order (writer loop)
        self.received = 0
        self._committed = 0
        self._stuck = False  # a batch was given up: nothing after it counts as committed
        self.written = self.unchanged = self.batches = 0
        #: batches waiting to be written, the last one gathering, with their commits
        self._queue: deque[tuple[list[dict[str, Any]], asyncio.Future[None]]] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._listeners: list[Any] = []
        self._lock_fd: int | None = None
        #: the engine's asyncio loop (None under another reactor), and the items of its
        #: current turn with the future of their commit (see process_item)
        self._engine_loop: asyncio.AbstractEventLoop | None = None
        self._group: tuple[list[dict[str, Any]], asyncio.Future[None]] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ItemSink:
        settings = crawler.settings
        key = settings.get("CRAWLHUB_ITEMS_KEY")
        if isinstance(key, str) and key.startswith("["):
            key = json.loads(key)
        spec = sink_spec(settings.get("CRAWLHUB_ITEMS"), key)
        sink = cls(crawler, spec, batch=_int(settings, "CRAWLHUB_ITEMS_BATCH", 500, 1))
        _OPEN[crawler] = sink
        return sink

    @staticmethod
    def of(crawler: Any) -> ItemSink | None:
        """The ItemSink of ``crawler``'s pipelines, if it has one (the scheduler asks)."""
        return _OPEN.get(crawler)

    # ------------------------------------------------------------------ watermark
    def committed_through(self) -> int:
        """How many of the items received so far are committed (in order): a request
        whose items were received by ``n`` is safe to finish once this reaches ``n``."""
        return self._committed

    def on_commit(self, listener: Any) -> None:
        """Call ``listener()`` (from the writer's thread) after every commit."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ pipeline
    def open_spider(self, spider: Any = None) -> None:
        if self.spec.get("type", "jsonl") == "jsonl":
            self._lock_file()
        self._engine_loop = running_engine_loop()
        self.loop = LoopThread("crawlhub-items")
        try:
            self.loop.run(self.sink.open(), timeout=60)
        except BaseException:
            self.loop.stop()
            self.loop = None
            self._unlock_file()
            raise
        log.info("crawlhub items: writing to sink %s (%s, key %s)", self.sink.name,
                 self.spec.get("type", "jsonl"), self.spec["key"])

    async def process_item(self, item: Any, spider: Any = None) -> Any:
        from itemadapter import ItemAdapter
        from scrapy.exceptions import DropItem

        record = ItemAdapter(item).asdict()
        try:
            self._preparer.record(record, 0)
        except SinkError as exc:
            self.stats.inc_value("item_sink/refused")
            log.error("crawlhub items: %s", exc)
            raise DropItem(str(exc)) from None
        assert self.loop is not None
        self.received += 1
        engine_loop = self._engine_loop
        if engine_loop is not None:
            # On the engine's asyncio loop the items of one loop turn cross to the writer
            # together: one hand-off each way per group, not per item.
            group = self._group
            if group is None:
                group = self._group = ([], engine_loop.create_future())
                engine_loop.call_soon(self._ship)
            group[0].append(record)
            await asyncio.shield(group[1])
        else:
            await engine_wait(self.loop.submit(self._add(record)))
        self._set_stats()
        return item

    def _ship(self) -> None:
        """(Engine's loop) hand the gathered items to the writer; their future is settled
        with the commit of the last of them (batches commit in order, and a batch given
        up fails every batch after it)."""
        group, self._group = self._group, None
        if group is None:
            return
        records, done = group
        engine_loop = self._engine_loop
        assert self.loop is not None and engine_loop is not None

        def settle(fut: Any) -> None:
            if done.done():
                return
            if fut.cancelled():  # the writer's loop stopped under it
                done.cancel()
                return
            exc = fut.exception()
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(None)

        self.loop.submit(self._add(*records)).add_done_callback(
            lambda fut: engine_loop.call_soon_threadsafe(settle, fut))

    def close_spider(self, spider: Any = None) -> None:
        if self.loop is None:
            return
        try:
            self.loop.run(self._close(), timeout=CLOSE_TIMEOUT + 60)
        except Exception:
            log.exception("crawlhub items: closing sink %s failed", self.sink.name)
        finally:
            self.loop.stop()
            self.loop = None
            self._unlock_file()
            self._set_stats()

    def _set_stats(self) -> None:
        self.stats.set_value("item_sink/written", self.written)
        self.stats.set_value("item_sink/unchanged", self.unchanged)
        self.stats.set_value("item_sink/batches", self.batches)

    def _lock_file(self) -> None:
        """A JSON lines file is one spider's output: spiders that share their items write
        them to SQLite or PostgreSQL. A second spider on the file is refused, naming the
        fix (the lock goes with the process, also when it is killed)."""
        import fcntl

        path = Path(getattr(self.sink, "path", None) or "items.jsonl")  # the file written
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise _error("CRAWLHUB_ITEMS", f"{path} is written by another spider process:"
                         " give each spider its own .jsonl file, or share a SQLite file"
                         " (items.db) or a PostgreSQL table") from None
        self._lock_fd = fd

    def _unlock_file(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    # ------------------------------------------------------------------ writer loop
    async def _add(self, *records: dict[str, Any]) -> None:
        """Join the batch that gathers and wait for the commit of the last batch the
        records went into (group commit: while one batch is written the next one
        gathers)."""
        if self._stuck:
            raise SinkError(f"sink '{self.sink.name}' gave up at close; the item is not"
                            " written and its request stays unfinished")
        loop = asyncio.get_running_loop()
        for record in records:
            if not self._queue or len(self._queue[-1][0]) >= self.batch_max:
                self._queue.append(([], loop.create_future()))
            self._queue[-1][0].append(record)
        done = self._queue[-1][1]
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all())
        await asyncio.shield(done)

    async def _write_all(self) -> None:
        while self._queue:
            records, done = self._queue.popleft()
            try:
                await self._write(records)
            except Exception as exc:  # given up at close: nothing after counts as committed
                self._stuck = True
                for _, waiting in [(records, done), *self._queue]:
                    if not waiting.done():
                        waiting.set_exception(exc)
                self._queue.clear()
                return
            self._committed += len(records)
            done.set_result(None)
            for listener in self._listeners:
                listener()

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        """One batch, retried until it is written (or, closing, until CLOSE_TIMEOUT)."""
        failing_since: float | None = None
        while True:
            try:
                result = await self.sink.write_batch(batch)
            except Exception as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning("crawlhub items: sink %s failed (%s: %s); %d items wait in"
                                " memory, their requests stay unfinished; retrying every %ss",
                                self.sink.name, type(exc).__name__, exc, len(batch), BACKOFF)
                if self._closing and now - failing_since > CLOSE_TIMEOUT:
                    log.error("crawlhub items: sink %s still fails at close; %d items not"
                              " written: their requests stay unfinished and go to the next"
                              " spider", self.sink.name,
                              len(batch) + sum(len(r) for r, _ in self._queue))
                    raise
                await asyncio.sleep(BACKOFF)
                continue
            if failing_since is not None:
                log.warning("crawlhub items: sink %s answers again", self.sink.name)
            self.batches += 1
            self.written += result.written
            self.unchanged += result.skipped
            return

    async def _close(self) -> None:
        self._closing = True
        if self._writer is not None:
            await asyncio.wait({self._writer}, timeout=CLOSE_TIMEOUT + 30)
        await self.sink.close()

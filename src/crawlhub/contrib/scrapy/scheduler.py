"""``SCHEDULER = "crawlhub.contrib.scrapy.Scheduler"``: a Scrapy scheduler on the frontier.

Requests are admitted through the crawl's frontier (dedup by key, once per time
segment), stored with their priority, and handed out with leases: a request counts as
finished only when the engine is done with it, that is when its response (or its final
failure) went through the callback and every request the callback yielded is stored. A
spider killed with SIGKILL therefore loses nothing: its leases run out and the requests
go to the next spider. Any number of spider processes on one Redis (or on one machine's
data directory) share a crawl.

How it runs beside the engine. Scrapy calls ``enqueue_request`` and ``next_request``
synchronously on the reactor thread. ``enqueue_request`` only touches memory (a request
this spider sent before in the segment is dropped at once by a local filter); a worker
on a loop of its own (:class:`~crawlhub.contrib.scrapy.loop.LoopThread`) moves requests
to and from the frontier in batches, one step every ``FLUSH`` while requests flow (the
engine wakes it only when memory runs low or nothing is served, never per request, as a
wake-up hands it the GIL mid-engine): it admits what was enqueued, *then* finishes what
the engine is done with (so a parent is finished only after its children are stored),
leases up to ``CRAWLHUB_PREFETCH`` requests ahead and feeds tasks from the crawl's start
queue (the hub's outbound) into the frontier. When Redis is away the worker keeps
everything in memory and retries; the engine keeps crawling what it holds.

Scrapy's scheduler contract. The requests a spider holds are a priority heap (priority,
then the store's order: ``CRAWLHUB_ORDER``, LIFO by default as in Scrapy), so a request
arriving late with a higher priority, or a newer one under LIFO, is leased at once and
served before those held ahead (the heap stays within twice the prefetch: the worst go
back to the crawl). ``next_request`` serves from that memory first; when it holds
nothing, or what was just enqueued outranks it, and the store may have work, it waits
for one worker step (admit, then lease), so an enqueue is followed by its dequeue in one
process. ``has_pending_requests`` is this spider's work (held, enqueued, or ready in the
store); requests other spiders hold keep the spider open through ``spider_idle``.
``len`` counts every pending request of the crawl.

Spiders beat: beside the worker, a beat renews the leases of the requests this spider
runs or holds ahead every fifth of ``CRAWLHUB_LEASE`` (5 s by default). A spider killed
or frozen stops beating, and its requests are free for the others once its last beat's
leases end, a few seconds later; a spider with nothing to crawl while others hold
leases says so in its log (how many, and when the next one is free).

Items: with :class:`~crawlhub.contrib.scrapy.items.ItemSink` in ``ITEM_PIPELINES``, a
request is finished only once every item its callback produced is committed to the
sink (see :mod:`crawlhub.contrib.scrapy.items`).

The one private Scrapy detail this relies on: the engine's slot calls
``remove_request(request)`` when it is done with a request; the scheduler wraps that
method of the slot it is opened with (Scrapy 2.11 to 2.19).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from crawlhub.contrib.scrapy.codec import Unserializable, request_from_data, request_to_data
from crawlhub.contrib.scrapy.dupefilter import DupeFilter, open_crawl_frontier
from crawlhub.contrib.scrapy.loop import EngineLoop, LoopThread, running_engine_loop
from crawlhub.contrib.scrapy.settings import CrawlSettings, read_settings
from crawlhub.core.errors import FrontierError
from crawlhub.frontier import Frontier
from crawlhub.frontier.bloom import FixedBloom, stable_hash
from crawlhub.frontier.seed import Outcome, Seed

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

    from crawlhub.contrib.scrapy.items import ItemSink
    from crawlhub.queues import QueueBackend

log = logging.getLogger("crawlhub.contrib.scrapy")
#: The longest entry taken from scrapy-redis's start URLs key (characters).
MAX_START_ENTRY = 64 * 1024

#: Seconds an idle worker waits before looking at the frontier and start queue again.
POLL = 0.2
#: Seconds the worker naps between steps while requests flow: what the engine enqueued
#: and finished meanwhile goes to the store as one batch, without a wake-up per request.
FLUSH = 0.02
#: Seconds between retries while the backend is unreachable.
BACKOFF = 1.0
#: Keys of the filter of keys a spider sent, at most (about 3 bytes each).
SENT_MAX = 4_000_000
#: Share of the frontier's false-positive budget that filter may use.
CACHE_SHARE = 0.01
#: Seconds between the log lines of a spider waiting for other spiders' leases.
WAIT_LOG_EVERY = 10.0
#: Seconds ``close`` keeps trying to store what is left before giving up on it.
CLOSE_TIMEOUT = 30.0
#: Requests this spider enqueued, kept as they are until it serves them (at most): one
#: it leases back is served without being rebuilt from its stored copy, as Scrapy's
#: memory queue serves the request it was given; another spider's is rebuilt.
LOCAL_MAX = 10_000
#: Seconds the engine's thread waits for one worker step (a dequeue right after an
#: enqueue, ``len``) before answering from memory.
SYNC_TIMEOUT = 5.0


class _Item:
    """One enqueued request on its way to the frontier."""

    __slots__ = ("ack", "keep", "request", "seed")

    def __init__(self, seed: Seed, request: Request, keep: bool, ack: str | None) -> None:
        self.seed = seed
        self.request = request  # for the dupefilter's log of a duplicate
        self.keep = keep  # unserializable: stays in memory, only its key is shared
        self.ack = ack  # receipt of the start-queue task it came from


class _StartURL:
    """A start URL popped from scrapy-redis's key: a task without a receipt."""

    __slots__ = ("payload", "receipt")

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.receipt: str | None = None


def _reads_own_start_urls(spider: Any) -> bool:
    """scrapy-redis's RedisSpider / RedisCrawlSpider pop their start URLs themselves."""
    return any(c.__module__.startswith("scrapy_redis") for c in type(spider).__mro__)


class _Built:
    """A held seed whose request was built ahead (the per-slot choice needs it)."""

    __slots__ = ("request", "seed", "slot")

    def __init__(self, seed: Seed | None, request: Request, slot: str) -> None:
        self.seed = seed  # None: a request kept in memory only
        self.request = request
        self.slot = slot


def _total(counts: list[dict[str, Any]], field: str) -> int:
    """``field`` (pending, leased) summed over the frontier's per-segment counts."""
    return sum(int(c.get(field, 0)) for c in counts)


def _seed_of(item: Any) -> Seed | None:
    """The leased seed of a held item (None: a request kept in memory only)."""
    if isinstance(item, _Built):
        return item.seed
    return item if isinstance(item, Seed) else None


class Scheduler:
    """A Scrapy scheduler whose requests live in a crawlhub frontier."""

    def __init__(self, dupefilter: Any = None, *, crawler: Crawler | None = None,
                 **_scrapy_options: Any) -> None:
        """Scrapy's signature: the dupefilter, and the crawler (optional until ``open``;
        Scrapy's queue options are the frontier's business here and ignored)."""
        self.crawler: Any = crawler
        self.stats: Any = crawler.stats if crawler is not None else None
        if dupefilter is None:
            if crawler is None:
                raise TypeError("crawlhub's Scheduler needs a dupefilter or a crawler")
            from scrapy.utils.misc import build_from_crawler, load_object

            dupefilter = build_from_crawler(
                load_object(crawler.settings.get("DUPEFILTER_CLASS")), crawler)
        self.df = dupefilter
        # Another dupefilter (Scrapy's, BaseDupeFilter: no dedup) decides duplicates here,
        # as under Scrapy's scheduler; the frontier then only keeps and leases requests.
        self._own_df = isinstance(dupefilter, DupeFilter)
        if self._own_df:
            dupefilter.attached = True
        self.settings: CrawlSettings | None = None
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        self.queues: QueueBackend | None = None
        self.loop: LoopThread | EngineLoop | None = None
        #: on the engine's loop: the store's pending count, last seen, and its recount
        self._stored_pending = 0
        self._recount: asyncio.Task[None] | None = None
        # reactor thread -> worker
        self._outbox: deque[_Item] = deque()
        # finished requests, each with the items received by then (see _settleable)
        self._done: deque[tuple[Seed, Outcome, int]] = deque()
        self._items: ItemSink | None = None
        # start-queue batches handed to the reactor (worker counts) and built (reactor)
        self._feeds_sent = 0
        self._feeds_built = 0
        # worker -> reactor thread: what this spider holds, a heap of
        # [-priority, rank, arrival, Seed | Request] (see _hold)
        self._ready: list[list[Any]] = []
        self._arrivals = 0
        self._ranks: tuple[int, int] | None = None  # lowest and highest rank held so far
        self._store_ready = False  # the store may have requests ready for this spider
        self._admitting = 0  # enqueued requests the worker is storing
        self._outbox_top: int | None = None  # highest priority waiting in the outbox
        #: highest priority of the requests the worker is storing now (taken from the
        #: outbox, not yet leased back): next_request waits for them as for the outbox
        self._admitting_top: int | None = None
        self._failing = False  # the worker's last store step failed
        self._lock: asyncio.Lock | None = None  # one store step at a time
        self._mem = threading.Lock()  # the heap, changed by the worker and the engine
        self._claim_more = 0  # admitted requests that outrank the worst one held
        self._running: dict[Request, Seed] = {}
        self._local: dict[str, Request] = {}  # by key, see LOCAL_MAX (engine's thread)
        self._inc: Any = None  # the stats' inc_value, looked up once
        self._failed: set[int] = set()  # ids of running requests whose callback failed
        self._busy = 0  # items the worker took and has not settled yet
        self._left = True  # the crawl owes requests (pending or leased, any spider)
        self._closing = False
        self._stopping = False  # the worker ends after its current step
        self._stop_beat: asyncio.Event | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._waits_logged = 0.0  # when the spider last said what it waits for
        self._event: asyncio.Event | None = None
        self._woken = False  # a wake-up is on its way to the worker (see _wake)
        self._dozing = False  # the worker waits out POLL: only a wake-up brings it back
        self._worker: Any = None
        self._idle_since: float | None = None
        self._warned_unserializable = False
        self._slot: Any = None
        self._sent: FixedBloom | None = None  # keys this spider sent (see _sent_before)
        self._sent_segment: int | None = None
        self._start_urls_redis: Any = None  # REDIS_START_URLS_KEY's server
        self._engine_loop: asyncio.AbstractEventLoop | None = None  # see _call_engine

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        return cls(crawler=crawler)

    # ------------------------------------------------------------------ lifecycle
    def open(self, spider: Spider) -> Deferred[None] | None:
        """Open the crawl's store. On the engine's asyncio loop this returns a Deferred the
        engine awaits (the store opens on that loop); on its own thread, it blocks."""
        if self.crawler is None:
            self.crawler = getattr(spider, "crawler", None)
            if self.crawler is None:
                raise TypeError("crawlhub's Scheduler reads its settings from the crawler:"
                                " build it with Scheduler.from_crawler(crawler)")
            self.stats = self.crawler.stats
        self.spider = spider
        try:
            self._engine_loop = asyncio.get_running_loop()
        except RuntimeError:  # a Twisted reactor of another kind runs the engine
            self._engine_loop = None
        self._inc = self.stats.inc_value
        self.settings = s = read_settings(self.crawler.settings, spider.name)
        if self._own_df:
            self.df.configure(s)
        elif hasattr(self.df, "open"):
            self.df.open()
        self.frontier = open_crawl_frontier(s)
        if s.start_queue:
            from crawlhub.queues import open_backend

            self.queues = open_backend(s.queues_url, prefix=s.prefix)
        engine_loop = self._engine_loop if self._inline_possible() else None
        if engine_loop is not None:
            self.loop = EngineLoop(engine_loop)
            from twisted.internet.defer import Deferred

            return Deferred.fromFuture(self.loop.submit(self._open_on_engine()))
        self.loop = LoopThread(f"crawlhub-scheduler-{s.crawl}")
        try:
            self.loop.run(self._open())
        except BaseException:
            self.loop.stop()
            raise
        self._opened()
        return None

    def _inline_possible(self) -> bool:
        """The storage I/O may run on the engine's own loop: Scrapy's engine runs on the
        asyncio loop of this thread (not a test's stand-in) and CRAWLHUB_LOOP allows it."""
        if self._engine_loop is None or running_engine_loop() is not self._engine_loop:
            return False
        assert self.settings is not None
        if self.settings.loop == "thread":
            return False
        from scrapy.core.engine import ExecutionEngine

        return isinstance(getattr(self.crawler, "engine", None), ExecutionEngine)

    async def _open_on_engine(self) -> None:
        assert self.loop is not None
        try:
            await self._open()
        except BaseException:
            self.loop.stop()
            self.loop = None
            raise
        self._opened()

    def _opened(self) -> None:
        """What follows the store's opening, on the engine's thread."""
        assert self.loop is not None and self.settings is not None and self.spider is not None
        s, spider = self.settings, self.spider
        self._hook_engine()
        from crawlhub.contrib.scrapy.items import ItemSink

        self._items = ItemSink.of(self.crawler)
        if self._items is not None:
            self._items.on_commit(self._wake)
        from scrapy import signals

        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self.crawler.signals.connect(self._on_error, signal=signals.spider_error)
        self._worker = self.loop.submit(self._work())
        self.loop.call_soon(self._start_beat)
        log.info("crawlhub scheduler: crawl %r on %s (key %s, %s, %s, lease %ss, prefetch"
                 " %d%s%s)", s.crawl, s.backend,
                 s.key if self._own_df else type(self.df).__qualname__, s.order,
                 "per-slot fair" if s.fair else "by priority", s.lease, s.prefetch,
                 f", start queue {s.start_queue!r}" if s.start_queue else "",
                 ", on the engine's loop" if self.loop.inline else "",
                 extra={"spider": spider})

    async def _open(self) -> None:
        assert self.frontier is not None and self.settings is not None
        self._event = asyncio.Event()
        self._stop_beat = asyncio.Event()
        self._lock = asyncio.Lock()
        await self.frontier.open()
        if self.settings.flush_on_start:
            await self.frontier.store.purge()
            log.info("crawlhub scheduler: crawl %r flushed on start (SCHEDULER_FLUSH_ON_START)",
                     self.settings.crawl)
        # what the crawl owes, known before the engine first asks (no phantom work)
        now = self.frontier.clock()
        due = await self.frontier.store.next_due(now)
        self._left = due is not None
        self._store_ready = due is not None and due <= now
        if self._left:
            pending = _total(await self.frontier.stats(), "pending")
            self._stored_pending = pending
            if pending:
                log.info("Resuming crawl (%d requests scheduled)", pending,
                         extra={"spider": self.spider})

    def _hook_engine(self) -> None:
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
        if slot is None or not hasattr(slot, "remove_request"):
            raise RuntimeError("crawlhub scheduler: this Scrapy's engine has no slot with "
                               "remove_request (supported: Scrapy 2.11 to 2.19)")
        done = slot.remove_request

        def remove_request(request: Request) -> None:
            try:
                done(request)
            finally:
                self._finished(request)

        slot.remove_request = remove_request
        self._slot = slot

    def close(self, reason: str) -> Deferred[None] | None:
        if self.loop is None:
            return None
        self._closing = True
        if isinstance(self.loop, EngineLoop):
            from twisted.internet.defer import Deferred

            return Deferred.fromFuture(asyncio.ensure_future(self._close_on_engine(reason)))
        try:
            self.loop.run(self._close(reason), timeout=CLOSE_TIMEOUT + 30)
        except Exception:
            log.exception("crawlhub scheduler: closing crawl %r failed",
                          self.settings.crawl if self.settings else "?")
        finally:
            self._closed(reason)
        return None

    async def _close_on_engine(self, reason: str) -> None:
        try:
            await asyncio.wait_for(self._close(reason), CLOSE_TIMEOUT + 30)
        except Exception:
            log.exception("crawlhub scheduler: closing crawl %r failed",
                          self.settings.crawl if self.settings else "?")
        finally:
            self._closed(reason)

    def _closed(self, reason: str) -> None:
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
        if not self._own_df and hasattr(self.df, "close"):
            self.df.close(reason)

    async def _close(self, reason: str) -> None:
        assert self.frontier is not None and self.settings is not None
        await self._stop_worker()
        # the engine is done: what is still enqueued or finished must reach the store
        deadline = time.monotonic() + CLOSE_TIMEOUT
        while self._outbox or self._settleable():
            try:
                await self._settle()
            except Exception as exc:
                if time.monotonic() > deadline:
                    log.error("crawlhub scheduler: %d requests enqueued and %d finished could"
                              " not be stored (%s); their parents stay leased and return to"
                              " the crawl when the leases end", len(self._outbox),
                              len(self._done), exc)
                    break
                await asyncio.sleep(BACKOFF)
        unstarted = [x for x in (_seed_of(e[3]) for e in self._ready) if x is not None]
        self._ready.clear()
        uncommitted = [seed for seed, _, _ in self._done]
        self._done.clear()
        if uncommitted:  # their items never reached the sink: crawl them again
            log.warning("crawlhub scheduler: %d requests of crawl %r return to the crawl: the"
                        " items their callbacks produced were not committed", len(uncommitted),
                        self.settings.crawl)
        with contextlib.suppress(Exception):
            await self.frontier.release(unstarted + uncommitted)
        if not self.settings.persist:
            if reason == "finished":
                await self.frontier.store.purge()
                log.info("crawlhub scheduler: crawl %r dropped at its end (SCHEDULER_PERSIST"
                         " is off)", self.settings.crawl)
            else:
                log.info("crawlhub scheduler: crawl %r kept: the spider closed (%s) before"
                         " the crawl ended", self.settings.crawl, reason)
        await self.frontier.close()
        if self.queues is not None:
            await self.queues.close()
        if self._start_urls_redis is not None:
            with contextlib.suppress(Exception):
                await self._start_urls_redis.aclose()

    # ------------------------------------------------------------------ engine side
    def has_pending_requests(self) -> bool:
        """This spider has requests to crawl: held, enqueued, or ready in the store.
        (Requests other spiders hold keep it open through ``spider_idle`` instead, so
        ``next_request`` answers a request whenever this is True.)"""
        local = bool(self._ready or self._outbox or self._admitting
                     or self._feeds_sent != self._feeds_built)
        if isinstance(self.loop, EngineLoop):
            # on the engine's loop "ready in the store" stays a belief: the worker leases
            # on its next turn, and nudges the engine if the store had nothing after all
            if not local and self._store_ready:
                self._wake()
            return local or self._store_ready
        if not local and self._store_ready and self._needs_step():
            self._step_now()  # "ready in the store" is a belief: lease to be sure
            local = bool(self._ready)
        return local or (self._store_ready and self._failing)

    def enqueue_request(self, request: Request, *, ack: str | None = None) -> bool:
        """Queue ``request`` for admission (the frontier decides duplicates; one found
        later is counted as ``dupefilter/filtered`` and logged by the dupefilter)."""
        assert self.spider is not None
        if request.dont_filter:
            key = f"!{uuid.uuid4().hex}"
        elif not self._own_df:  # the project's dupefilter decides, as in Scrapy
            if self.df.request_seen(request):
                self.df.log(request, self.spider)
                return False
            key = f"!{uuid.uuid4().hex}"
        else:
            key = self.df.key(request)
            if self._sent_before(key):
                self.df.log(request, self.spider)
                return False
        keep = False
        try:
            data = request_to_data(request, self.spider)
            data.pop("url", None)
            seed = Seed(request.url, method=request.method, priority=request.priority,
                        meta={"r": data})
        except Unserializable as exc:
            keep = True
            seed = Seed(request.url, method=request.method, priority=request.priority)
            self.stats.inc_value("scheduler/unserializable")
            self.stats.inc_value("scheduler/enqueued/memory")
            if not self._warned_unserializable:
                self._warned_unserializable = True
                log.warning("Unable to serialize request: %s - reason: %s - such requests stay"
                            " in this spider's memory (not shared, lost if it is killed); no"
                            " more unserializable requests will be logged", request, exc,
                            extra={"spider": self.spider})
        seed.key = key
        if not keep:
            local = self._local
            if len(local) >= LOCAL_MAX:
                del local[next(iter(local))]  # the oldest
            local[key] = request
        self._outbox.append(_Item(seed, request, keep, ack))
        top = self._outbox_top
        if top is None or seed.priority > top:
            self._outbox_top = seed.priority
        inc = self._inc
        inc("scheduler/enqueued/crawlhub")
        inc("scheduler/enqueued")
        if len(self._outbox) == 1:
            self._wake(urgent=False)
        return True

    def _sent_before(self, key: str) -> bool:
        """True when this spider sent ``key`` to the frontier already in the current
        segment: a duplicate known without serializing it or asking the store (the
        frontier judges every other key). A bounded filter with a sliver of the
        frontier's false-positive budget (``CACHE_SHARE``)."""
        assert self.frontier is not None
        segment = self.frontier.current_segment()
        if segment != self._sent_segment or self._sent is None:
            fc = self.frontier.config
            self._sent = FixedBloom(min(fc.expected_items, SENT_MAX), fc.fp_rate * CACHE_SHARE)
            self._sent_segment = segment
        h = stable_hash(key)
        if h in self._sent:
            return True
        self._sent.add(h)
        return False

    def next_request(self) -> Request | None:
        """The best request this spider holds. Memory first; when memory holds nothing
        (or less than what was just enqueued) while this spider has work, one worker
        step (admit, lease) runs first, so a request enqueued is served at once."""
        assert self.spider is not None
        if self._needs_step():
            self._step_now()
        fair = self.settings is not None and self.settings.fair
        while self._ready:
            with self._mem:
                if not self._ready:
                    break
                entry = self._pop_fair() if fair else heapq.heappop(self._ready)
            if entry is None:
                break
            item = entry[3]
            seed = _seed_of(item)
            if isinstance(item, _Built):
                request = item.request
            elif seed is not None:
                built = self._build(seed)
                if built is None:
                    continue
                request = built
            else:
                request = item
            if seed is not None:
                if request in self._running:  # leased again while it runs (a lease ran out)
                    copy = self._rebuild(seed)
                    if copy is None:
                        continue
                    request = copy
                self._running[request] = seed
                if self._local.get(seed.key or "") is request:
                    del self._local[seed.key or ""]  # served: a lease of it again rebuilds
            inc = self._inc
            inc("scheduler/dequeued/crawlhub")
            inc("scheduler/dequeued")
            if len(self._ready) * 2 < self._prefetch:
                self._wake()
            self._idle_since = None
            return request
        self._wake()
        return None

    def _needs_step(self) -> bool:
        """Memory cannot answer as Scrapy's scheduler would: it is empty while the spider
        has work, or the outbox holds a higher priority than the best held request."""
        if self.loop is None or self._failing or self._closing:
            return False
        if not self._ready:
            return bool(self._outbox or self._admitting or self._store_ready)
        best = -self._ready[0][0]
        top = self._outbox_top
        if top is not None and self._outbox and top > best:
            return True
        storing = self._admitting_top  # taken by the worker's step under way
        return storing is not None and storing > best

    def _step_now(self) -> None:
        """(Reactor thread) run one worker step and wait for it (``SYNC_TIMEOUT`` at most:
        a slow store leaves the answer to the worker)."""
        assert self.loop is not None
        if isinstance(self.loop, EngineLoop):
            self._wake()  # the engine's loop cannot wait for itself: the worker steps
            return
        try:
            self.loop.run(self._cycle(), timeout=SYNC_TIMEOUT)
        except Exception as exc:  # the worker logs and retries the store's failures
            log.debug("crawlhub scheduler: a step for the engine failed: %r", exc)

    def _build(self, seed: Seed) -> Request | None:
        """(Reactor thread) the request of a leased seed; one that cannot be rebuilt is
        finished as failed."""
        request = self._local.get(seed.key or "")
        if request is not None:  # enqueued here and not served yet
            return request
        return self._rebuild(seed)

    def _rebuild(self, seed: Seed) -> Request | None:
        """(Reactor thread) the request of ``seed`` from its stored copy."""
        assert self.spider is not None
        try:
            data = dict(seed.meta["r"])
            data["url"] = seed.url
            return request_from_data(data, self.spider)
        except Exception as exc:
            log.error("crawlhub scheduler: stored request %s cannot be rebuilt (%s: %s); it"
                      " is finished as failed", seed.url, type(exc).__name__, exc,
                      extra={"spider": self.spider})
            self._done.append((seed, "failed", 0))
            self._wake()
            return None

    def _pop_fair(self) -> list[Any] | None:
        """DownloaderAwarePriorityQueue's choice among the held requests: the download
        slot with the fewest active downloads (then the smallest name), and that slot's
        best request. Each held request is built once, its slot found once; while they
        all share one slot (one site) the choice is the heap's best, taken in O(log n)."""
        downloader = getattr(getattr(self.crawler, "engine", None), "downloader", None)
        if downloader is None or not hasattr(downloader, "get_slot_key"):
            return heapq.heappop(self._ready)
        ready = self._ready
        lost = False  # a stored request that cannot be rebuilt (finished as failed)
        slot: str | None = None
        many = False  # the held requests are in more than one slot
        for entry in ready:
            item = entry[3]
            if type(item) is not _Built:
                seed = item if isinstance(item, Seed) else None
                request = self._build(item) if seed is not None else item
                if request is None:
                    entry[3] = None
                    lost = True
                    continue
                entry[3] = item = _Built(seed, request, downloader.get_slot_key(request))
            if slot is None:
                slot = item.slot
            elif item.slot != slot:
                many = True
        if lost:
            ready[:] = [e for e in ready if e[3] is not None]
            heapq.heapify(ready)
        if not ready:
            return None
        if not many:
            return heapq.heappop(ready)
        best: dict[str, list[Any]] = {}
        for entry in ready:
            at = entry[3].slot
            if at not in best or entry[:3] < best[at][:3]:
                best[at] = entry
        slots = getattr(downloader, "slots", {})

        def load(slot: str) -> tuple[int, str]:
            held = slots.get(slot)
            return (len(held.active) if held is not None else 0, slot)

        chosen = best[min(best, key=load)]
        ready.remove(chosen)
        heapq.heapify(ready)
        return chosen

    def __len__(self) -> int:
        """Every pending request of the crawl: those in the store (any spider's, not
        leased) and those this spider holds or is storing."""
        held = len(self._ready) + len(self._outbox)
        if self.loop is None or self._failing:
            return held
        if isinstance(self.loop, EngineLoop):
            # the engine's loop cannot wait for the store: what it held when last counted
            # (at open, then on each call, in the background)
            if self._recount is None or self._recount.done():
                self._recount = self.loop.submit(self._count_stored())
            return held + self._stored_pending
        try:
            return int(self.loop.run(self._count(), timeout=SYNC_TIMEOUT))
        except Exception as exc:
            log.debug("crawlhub scheduler: counting the crawl failed: %r", exc)
            return held

    async def _count_stored(self) -> None:
        assert self.frontier is not None
        with contextlib.suppress(Exception):  # the worker logs the store's failures
            self._stored_pending = _total(await self.frontier.stats(), "pending")

    async def _count(self) -> int:
        assert self.frontier is not None and self._lock is not None
        async with self._lock:
            await self._settle()
            counts = await self.frontier.stats()
        return _total(counts, "pending") + len(self._ready) + len(self._outbox)

    @property
    def _prefetch(self) -> int:
        return self.settings.prefetch if self.settings else 16

    def _finished(self, request: Request) -> None:
        seed = self._running.pop(request, None)
        if seed is None:
            return  # not one of ours (engine.download, or a memory-only request)
        failed = id(request) in self._failed
        self._failed.discard(id(request))
        mark = self._items.received if self._items is not None else 0
        self._done.append((seed, "failed" if failed else "ok", mark))
        self._wake(urgent=False)

    def _on_error(self, failure: Any, response: Any, spider: Spider) -> None:
        request = getattr(response, "request", None)
        if request is not None and request in self._running:
            self._failed.add(id(request))

    def _on_idle(self, spider: Spider) -> None:
        from scrapy.exceptions import DontCloseSpider

        s = self.settings
        if s is None or self._closing:
            return
        if self._left or self._done or self._busy or self.has_pending_requests():
            # the crawl still owes requests (other spiders hold some, some wait for their
            # time) or this spider's finished ones are not stored yet: it may get more
            self._idle_since = None
            self._wake()
            raise DontCloseSpider
        if s.max_idle < 0:
            raise DontCloseSpider
        if s.max_idle > 0:
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            if now - self._idle_since < s.max_idle:
                raise DontCloseSpider

    def _log_dupes(self, items: list[_Item]) -> None:
        """(Reactor thread) the dupefilter logs and counts each filtered request."""
        spider = self.spider
        local = self._local
        for x in items:
            key = x.seed.key or ""
            if local.get(key) is x.request:
                del local[key]
            if spider is not None:
                self.df.log(x.request, spider)

    def _wake(self, urgent: bool = True) -> None:
        """Have the worker take a step. A wake-up crosses threads (a write to the worker
        loop's pipe, which hands the GIL to the worker mid-engine), so at most one goes
        per step, and one that is not ``urgent`` (a request finished or enqueued) only to
        a dozing worker: a working or napping one looks again within ``FLUSH``."""
        if self._woken or not (urgent or self._dozing):
            return
        loop, event = self.loop, self._event
        if loop is not None and event is not None:
            self._woken = True
            loop.call_soon(event.set)

    def _nudge(self) -> None:
        """Have the engine ask for requests now (from the worker's thread)."""
        slot = self._slot
        if slot is not None and not self._closing:
            self._call_engine(slot.nextcall.schedule)

    def _stat(self, name: str, n: int = 1) -> None:
        self._call_engine(self.stats.inc_value, name, n)

    def _call_engine(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on the engine's thread: through the asyncio loop the engine
        runs on (the asyncio reactor, or Scrapy without a reactor), else the reactor."""
        if isinstance(self.loop, EngineLoop):
            self.loop.call_soon(fn, *args)
            return
        loop = self._engine_loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed: the engine is gone
                loop.call_soon_threadsafe(fn, *args)
            return
        from twisted.internet import reactor

        reactor.callFromThread(fn, *args)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ worker
    async def _stop_worker(self) -> None:
        """Have the worker end after the step it is in, so what it took from the outbox is
        stored or put back before ``_close`` looks (a cancel mid-step left them in the
        worker's hands, and on Python 3.11 a cancel met by a timeout could be swallowed,
        leaving the worker running and the loop's stop to time out)."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        self._stopping = True
        self._wake_now()
        if self._stop_beat is not None:
            self._stop_beat.set()
        task = asyncio.wrap_future(worker)
        done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)
        if not done:  # stuck in a storage call: cancel it (what it held is put back)
            log.warning("crawlhub scheduler: the worker of crawl %r did not stop within %ss;"
                        " cancelling it", self.settings.crawl if self.settings else "?",
                        CLOSE_TIMEOUT)
            worker.cancel()
            await asyncio.wait({task}, timeout=5)
        elif not task.cancelled() and task.exception() is not None:
            log.error("crawlhub scheduler: the worker of crawl %r had failed: %r",
                      self.settings.crawl if self.settings else "?", task.exception())
        if self._beat_task is not None:
            await asyncio.wait({self._beat_task}, timeout=CLOSE_TIMEOUT)

    async def _beat(self) -> None:
        """Renew this spider's leases every fifth of ``CRAWLHUB_LEASE``, beside the worker
        (a long store step of the worker does not delay it): the renewal is the spider's
        heartbeat. A spider that stops beating (killed, frozen) has its requests taken
        back by the others once its leases run out, a few seconds later."""
        assert self.settings is not None and self._stop_beat is not None
        every = self.settings.lease / 5
        while not self._stopping:
            await self._pause(every, self._stop_beat)
            if self._stopping:
                return
            try:
                await self._renew()
            except Exception as exc:  # the worker logs the store's failures
                log.debug("crawlhub scheduler: beat of crawl %r failed: %s",
                          self.settings.crawl, exc)

    def _start_beat(self) -> None:
        """(Worker's loop) start the beat."""
        self._beat_task = asyncio.get_running_loop().create_task(self._beat())

    def _wake_now(self) -> None:
        """(Worker's loop) wake the worker."""
        if self._event is not None:
            self._event.set()

    async def _pause(self, seconds: float, event: asyncio.Event | None = None) -> None:
        """Wait ``seconds`` or until ``event`` (the worker's wake-up) is set: the worker's
        and the beat's one way to wait; they end on a flag, never on a cancel."""
        event = event or self._event
        assert event is not None
        if event.is_set():
            return
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({waiter}, timeout=seconds)
        finally:
            waiter.cancel()

    async def _work(self) -> None:
        assert self.settings is not None and self._event is not None
        failing = False
        while not self._stopping:
            self._woken = False
            self._event.clear()
            try:
                progressed = await self._cycle()
                self._failing = False
                if failing:
                    log.warning("crawlhub scheduler: storage of crawl %r answers again",
                                self.settings.crawl)
                    failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:
                    log.warning("crawlhub scheduler: storage of crawl %r failed (%s: %s);"
                                " requests stay in memory, retrying every %ss",
                                self.settings.crawl, type(exc).__name__, exc, BACKOFF)
                failing = self._failing = True
                await self._pause(BACKOFF)
                continue
            if progressed or self._outbox or self._settleable():
                await self._pause(FLUSH)  # the crawl moves: gather the next batch
                continue
            self._dozing = True
            try:
                # looked at again once dozing: what came before the engine could see it
                # would wait out POLL
                if not (self._outbox or self._settleable()):
                    await self._pause(POLL)
            finally:
                self._dozing = False

    async def _cycle(self) -> bool:
        """Store what was enqueued, finish what is done, lease ahead; True if anything
        moved. One at a time: the worker's and the engine's (``_step_now``)."""
        assert self._lock is not None
        async with self._lock:
            try:
                progressed = await self._settle()
                progressed = await self._fill() or progressed
            finally:
                self._admitting_top = None  # stored and leased back (or put back)
            return progressed

    async def _settle(self) -> bool:
        """Admit the enqueued requests, then finish the done ones: a request's children
        are stored before it is finished. On failure both are put back."""
        assert self.frontier is not None
        n_done, n_out = self._settleable(), len(self._outbox)
        if not n_done and not n_out:
            return False
        self._busy += n_done + n_out
        self._admitting += n_out
        try:
            done = [self._done.popleft() for _ in range(n_done)]
            items = [self._outbox.popleft() for _ in range(n_out)]
            if items:
                self._admitting_top = max(x.seed.priority for x in items)
            if not self._outbox:
                self._outbox_top = None
            try:
                await self._admit(items)
            except BaseException:
                self._outbox.extendleft(reversed(items))
                self._done.extendleft(reversed(done))
                self._outbox_top = max((x.seed.priority for x in self._outbox), default=None)
                raise
            try:  # one round trip for every finished request
                await self.frontier.finish_many([(seed, outcome) for seed, outcome, _ in done])
            except BaseException:
                self._done.extendleft(reversed(done))
                raise
        finally:
            # What was just admitted or finished may have changed what the crawl owes
            # (a start request found duplicate leaves this spider with nothing local):
            # the verdict of an earlier look at the store no longer holds, so the crawl
            # counts as owing until _fill looks again. Left False from a look taken before
            # another spider admitted the start URL, it closed this spider early.
            self._left = True
            self._busy -= n_done + n_out
            self._admitting -= n_out
        return True

    def _settleable(self) -> int:
        """How many of the finished requests (from the left) may be finished in the
        frontier: with an ItemSink, those whose items are all committed. A request is
        marked with the count of items the sink had received when the engine was done
        with it (its own items are among them), so it waits until the sink has committed
        that many; marks never decrease, so the ready ones are a prefix."""
        done = self._done
        if self._items is None:
            return len(done)
        through = self._items.committed_through()
        n = 0
        while n < len(done) and done[n][2] <= through:
            n += 1
        return n

    async def _admit(self, items: list[_Item]) -> None:
        assert self.frontier is not None and self.spider is not None
        if not items:
            return
        stored = [x for x in items if not x.keep]
        kept = [x for x in items if x.keep]
        flags: dict[int, bool] = {}
        for group, dispatched in ((stored, False), (kept, True)):
            if not group:
                continue
            try:
                got = await self.frontier.admit([x.seed for x in group], dispatched=dispatched)
            except FrontierError:
                got = await self._admit_each(group, dispatched)
            flags.update(zip((id(x) for x in group), got, strict=True))
        dupes = []
        kept_now = []
        worst = self._worst_held()
        for x in items:
            if not flags[id(x)]:
                dupes.append(x)
            elif x.keep:
                kept_now.append(x.request)
            else:
                self._store_ready = True
                if self._outranks(x.seed.priority, worst):
                    self._claim_more += 1
        if kept_now:
            with self._mem:
                for request in kept_now:
                    self._hold(request, request.priority, self._kept_rank())
        if dupes:
            self._call_engine(self._log_dupes, dupes)
        acks = [x.ack for x in items if x.ack]
        if acks and self.queues is not None and self.settings and self.settings.start_queue:
            await self.queues.queue(self.settings.start_queue).ack(acks)
        if kept and any(flags[id(x)] for x in kept):
            self._nudge()

    async def _admit_each(self, group: list[_Item], dispatched: bool) -> list[bool]:
        """One by one after a batch failed on a URL the frontier cannot key: that request
        stays in memory (not shared, not deduplicated), the others are admitted."""
        assert self.frontier is not None
        out = []
        for x in group:
            try:
                (ok,) = await self.frontier.admit([x.seed], dispatched=dispatched)
            except FrontierError as exc:
                log.warning("crawlhub scheduler: %s; the request stays in this spider's"
                            " memory", exc)
                self._stat("scheduler/unshareable")
                x.keep, ok = True, True
            out.append(ok)
        return out

    async def _fill(self) -> bool:
        """Lease up to the prefetch, and beyond it as many as were just admitted above the
        worst held request (the heap keeps the best, the rest go back to the crawl); feed
        the start queue when the crawl runs dry."""
        assert self.frontier is not None and self.settings is not None
        if self._closing:
            return False
        s = self.settings
        more, self._claim_more = self._claim_more, 0
        want = max(s.prefetch - len(self._ready), min(more, 2 * s.prefetch))
        if want <= 0:
            return False
        if more > want:
            # more outrank what is held than one lease takes: what is held goes back,
            # so it comes out again in the store's order, after those
            await self._give_back(len(self._ready))
        seeds = await self.frontier.lease(want, s.lease)
        if len(seeds) < want:
            if self._store_ready and not seeds and isinstance(self.loop, EngineLoop):
                self._nudge()  # the engine was told of work that is not there: look again
            self._store_ready = False
        usable = []
        for seed in seeds:
            if seed.attempts > s.max_attempts:
                log.error("crawlhub scheduler: %s was leased %d times without finishing"
                          " (CRAWLHUB_MAX_ATTEMPTS %d): given up", seed.url, seed.attempts - 1,
                          s.max_attempts)
                self._stat("scheduler/crawlhub/given_up")
                await self.frontier.finish(seed, "failed")
            else:
                usable.append(seed)
        if usable:
            with self._mem:
                for seed in usable:
                    self._hold(seed, seed.priority, seed.rank or 0)
            await self._trim()
            self._left = True
            self._nudge()
            return True
        fed = await self._feed(want)
        if fed:
            return True
        if not (self._ready or self._outbox or self._done
                or self._feeds_sent != self._feeds_built):
            now = self.frontier.clock()
            due = await self.frontier.store.next_due(now)
            left = due is not None
            if left != self._left:
                self._left = left
                self._nudge()
            # looked at again after the await: a request of this spider may have
            # finished meanwhile (its own lease is not another spider's)
            if (due is not None and due > now and not self._running
                    and not (self._ready or self._outbox or self._done)):
                await self._log_wait(due - now)
        return False

    def _hold(self, item: Seed | Request, priority: int, rank: int) -> None:
        """(Under ``_mem``) put ``item`` in the heap: by priority, then rank (the store's
        order, smaller first), then arrival."""
        self._arrivals += 1
        heapq.heappush(self._ready, [-priority, rank, self._arrivals, item])
        low, high = self._ranks or (rank, rank)
        self._ranks = (min(low, rank), max(high, rank))

    def _kept_rank(self) -> int:
        """The rank of a request kept in memory: after every held one (FIFO) or before
        (LIFO), as the store would have placed it."""
        low, high = self._ranks or (0, 0)
        lifo = self.settings is not None and self.settings.order == "lifo"
        return low - 1 if lifo else high + 1

    def _worst_held(self) -> int | None:
        """The lowest priority held (None: nothing held)."""
        with self._mem:
            return min((-e[0] for e in self._ready), default=None)

    def _outranks(self, priority: int, worst: int | None) -> bool:
        """A request just admitted at ``priority`` goes before the worst one held, of
        priority ``worst`` (under LIFO a newer one of the same priority does too)."""
        if worst is None:
            return False
        lifo = self.settings is not None and self.settings.order == "lifo"
        return priority > worst or (lifo and priority == worst)

    async def _trim(self) -> None:
        """Keep the heap within twice the prefetch: the worst leased requests go back to
        the crawl (their attempt uncounted)."""
        if len(self._ready) > 2 * self._prefetch:
            await self._give_back(len(self._ready) - self._prefetch)

    async def _give_back(self, n: int) -> None:
        """Return the ``n`` worst held requests to the crawl (those kept in memory only
        stay)."""
        assert self.frontier is not None
        if n <= 0:
            return
        with self._mem:
            ordered = sorted(self._ready, key=lambda e: e[:3])
            cut = len(ordered) - n
            keep, back = ordered[:cut], []
            for entry in ordered[cut:]:
                seed = _seed_of(entry[3])
                if seed is None:  # memory only: it cannot go back
                    keep.append(entry)
                else:
                    back.append(seed)
            heapq.heapify(keep)
            self._ready[:] = keep
        if back:
            await self.frontier.release(back)
            self._store_ready = True

    async def _log_wait(self, seconds: float) -> None:
        """Nothing to crawl here while the crawl still owes requests: say what the spider
        waits for (once, then every ``WAIT_LOG_EVERY`` s while it waits)."""
        assert self.frontier is not None and self.settings is not None
        mono = time.monotonic()
        if mono - self._waits_logged < WAIT_LOG_EVERY:
            return
        self._waits_logged = mono
        counts = await self.frontier.stats()
        leased, waiting = _total(counts, "leased"), _total(counts, "pending")
        log.info("crawlhub scheduler: crawl %r waits for %d requests leased by other spiders"
                 " (%d more wait for their time); the next is free in %.1f s (a spider"
                 " that stops beating loses its leases %ss after its last beat,"
                 " CRAWLHUB_LEASE)", self.settings.crawl, leased, waiting, seconds,
                 self.settings.lease, extra={"spider": self.spider})

    async def _feed(self, want: int) -> bool:
        """Lease tasks from the start queue (or pop scrapy-redis start URLs) and hand them
        to the reactor to build."""
        messages: list[Any] = []
        if self.queues is not None and self.settings and self.settings.start_queue:
            queue = self.queues.queue(self.settings.start_queue)
            messages = await queue.lease(min(want, 100), self.settings.lease)
        if not messages:
            messages = await self._pop_start_urls(min(want, 100))
        if not messages:
            return False
        self._feeds_sent += 1
        self._call_engine(self._build_tasks, messages)
        return True

    async def _pop_start_urls(self, n: int) -> list[Any]:
        """scrapy-redis's start URLs (``REDIS_START_URLS_KEY``): popped from the Redis list
        (or set, ``REDIS_START_URLS_AS_SET``), a URL or a JSON task each. Popped, as
        scrapy-redis pops them: one popped by a spider killed before storing it is lost
        (the start queue, ``CRAWLHUB_START_QUEUE``, leases instead). Not for a
        ``RedisSpider``, which reads the key itself."""
        s = self.settings
        if s is None or not s.start_urls_key or _reads_own_start_urls(self.spider):
            return []
        if self._start_urls_redis is None:
            from crawlhub.backends.redis import redis_client

            self._start_urls_redis = redis_client(s.frontier_url, name="REDIS_START_URLS_KEY")
        client = self._start_urls_redis
        out: list[Any] = []
        while not out:  # until an entry is taken or the key is empty
            if s.start_urls_as_set:
                raw = await client.spop(s.start_urls_key, n)
            else:
                raw = await client.lpop(s.start_urls_key, n)
            if not raw:
                break
            out = self._start_entries(raw)
        return out

    def _start_entries(self, raw: list[Any]) -> list[Any]:
        """The tasks of entries popped from the start URLs key; the rest logged, dropped."""
        s = self.settings
        assert s is not None
        out = []
        for value in raw:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if len(text) > MAX_START_ENTRY:  # no URL or task is that long: refused whole
                log.error("crawlhub scheduler: a start URL from %s refused: an entry of %d"
                          " characters (at most %d)", s.start_urls_key, len(text),
                          MAX_START_ENTRY)
                continue
            task: Any = {"url": text}
            if text.lstrip().startswith("{"):
                try:
                    task = json.loads(text)
                except ValueError:
                    task = None
                if not isinstance(task, dict):
                    log.error("crawlhub scheduler: a start URL from %s refused: %r is"
                              " neither a URL nor a JSON object", s.start_urls_key, text[:200])
                    continue
            out.append(_StartURL(task))
        return out

    def _build_tasks(self, messages: list[Any]) -> None:
        """(Reactor thread) turn start-queue tasks into requests and enqueue them; a task
        that makes no request goes to the queue's dead letter with the reason."""
        assert self.spider is not None
        bad: list[tuple[str, str]] = []
        try:
            for m in messages:
                try:
                    requests = list(make_requests(self.spider, m.payload))
                except Exception as exc:
                    bad.append((m.receipt, f"{type(exc).__name__}: {exc}"))
                    continue
                if not requests:
                    bad.append((m.receipt, "the spider made no request of this task"))
                    continue
                for r in requests[:-1]:
                    self.enqueue_request(r)
                self.enqueue_request(requests[-1], ack=m.receipt)
        finally:
            self._feeds_built += 1
        for receipt, reason in bad:
            if receipt is None:  # popped from REDIS_START_URLS_KEY: gone, said here
                log.error("crawlhub scheduler: a start URL from %s refused: %s",
                          self.settings.start_urls_key if self.settings else "?",
                          reason[:300])
                continue
            log.error("crawlhub scheduler: start task %s refused: %s", receipt, reason)
            if (receipt and self.loop is not None and self.queues is not None and self.settings
                    and self.settings.start_queue):
                queue = self.queues.queue(self.settings.start_queue)
                self.loop.submit(queue.nack([receipt], dead=True, reason=reason))
        self._wake()

    def _held(self) -> list[Seed]:
        """The seeds this spider holds leases of: running, leased ahead, and finished but
        waiting for their items' commit."""
        with self._mem:
            held = [_seed_of(e[3]) for e in self._ready]
        return (list(self._running.values()) + [x for x in held if x is not None]
                + [x[0] for x in list(self._done)])

    async def _renew(self) -> None:
        """Extend the leases of requests in progress and of those leased ahead."""
        assert self.frontier is not None and self.settings is not None
        seeds = self._held()
        if not seeds:
            return
        kept = await self.frontier.extend(seeds, self.settings.lease)
        if all(kept):
            return
        # the worker may have finished some meanwhile (the beat runs beside it): only a
        # seed this spider still holds lost its lease
        held = {id(x) for x in self._held()}
        lost = sum(1 for seed, ok in zip(seeds, kept, strict=True) if not ok and id(seed) in held)
        if lost:
            log.warning("crawlhub scheduler: %d leases of crawl %r ran out before renewal"
                        " (the machine or the backend stalled over CRAWLHUB_LEASE %ss);"
                        " those requests may be fetched twice", lost, self.settings.crawl,
                        self.settings.lease)
            self._stat("scheduler/crawlhub/leases_lost", lost)


def make_requests(spider: Spider, task: dict[str, Any]) -> list[Request]:
    """The requests of one start task: the spider's ``make_requests_from_task(task)`` if
    it has one, else a request from the task's fields (``url``; optional ``method``,
    ``body``, ``headers``, ``meta``, ``priority``, ``dont_filter``, ``callback`` and
    ``errback`` naming spider methods, ``cb_kwargs``)."""
    from scrapy import Request

    own = getattr(spider, "make_requests_from_task", None)
    if callable(own):
        made = own(task)
        if made is None:
            return []
        return [made] if isinstance(made, Request) else list(made)
    url = task.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ValueError("the task has no 'url' string")

    def method_of(field: str) -> Any:
        name = task.get(field)
        if name is None:
            return None
        fn = getattr(spider, str(name), None)
        if not callable(fn):
            raise ValueError(f"{field} {name!r} is not a method of spider {spider.name!r}")
        return fn

    body = task.get("body")
    return [Request(
        url.strip(),
        method=str(task.get("method") or "GET"),
        body=body if isinstance(body, str | bytes) else None,
        headers=task.get("headers") or None,
        meta=dict(task.get("meta") or {}),
        priority=int(task.get("priority") or 0),
        dont_filter=bool(task.get("dont_filter")),
        callback=method_of("callback"),
        errback=method_of("errback"),
        cb_kwargs=dict(task.get("cb_kwargs") or {}),
    )]

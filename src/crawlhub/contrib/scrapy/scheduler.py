"""``SCHEDULER = "crawlhub.contrib.scrapy.Scheduler"``: a Scrapy scheduler on the frontier.

Requests are admitted through the crawl's frontier (dedup by key, once per time
segment), stored with their priority, and handed out with leases: a request counts as
finished only when the engine is done with it, that is when its response (or its final
failure) went through the callback and every request the callback yielded is stored. A
spider killed with SIGKILL therefore loses nothing: its leases run out and the requests
go to the next spider. Any number of spider processes on one Redis (or on one machine's
data directory) share a crawl.

How it runs beside the engine. Scrapy calls ``enqueue_request`` and ``next_request``
synchronously on the reactor thread. Both only touch memory (a request this spider
sent before in the segment is dropped at once by a local filter); a worker on a
loop of its own (:class:`~crawlhub.contrib.scrapy.loop.LoopThread`) moves them to and
from the frontier in batches: it admits what was enqueued, *then* finishes what the
engine is done with (so a parent is finished only after its children are stored),
leases up to ``CRAWLHUB_PREFETCH`` requests ahead and feeds tasks from the crawl's start
queue (the hub's outbound) into the frontier. When Redis is away the worker keeps
everything in memory and retries; the engine keeps crawling what it holds.

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
import logging
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from crawlhub.contrib.scrapy.codec import Unserializable, request_from_data, request_to_data
from crawlhub.contrib.scrapy.dupefilter import DupeFilter, open_crawl_frontier
from crawlhub.contrib.scrapy.loop import LoopThread
from crawlhub.contrib.scrapy.settings import CrawlSettings, read_settings
from crawlhub.core.errors import FrontierError
from crawlhub.frontier import Frontier
from crawlhub.frontier.bloom import FixedBloom, stable_hash
from crawlhub.frontier.seed import Outcome, Seed

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from crawlhub.contrib.scrapy.items import ItemSink
    from crawlhub.queues import QueueBackend

log = logging.getLogger("crawlhub.contrib.scrapy")

#: Seconds an idle worker waits before looking at the frontier and start queue again.
POLL = 0.2
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


class _Item:
    """One enqueued request on its way to the frontier."""

    __slots__ = ("ack", "keep", "request", "seed")

    def __init__(self, seed: Seed, request: Request, keep: bool, ack: str | None) -> None:
        self.seed = seed
        self.request = request  # for the dupefilter's log of a duplicate
        self.keep = keep  # unserializable: stays in memory, only its key is shared
        self.ack = ack  # receipt of the start-queue task it came from


class Scheduler:
    """A Scrapy scheduler whose requests live in a crawlhub frontier."""

    def __init__(self, crawler: Crawler, dupefilter: Any = None) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        if dupefilter is None:
            from scrapy.utils.misc import build_from_crawler, load_object

            dupefilter = build_from_crawler(
                load_object(crawler.settings.get("DUPEFILTER_CLASS")), crawler)
        if not isinstance(dupefilter, DupeFilter):
            raise TypeError(
                f"crawlhub's Scheduler keys requests with crawlhub's DupeFilter, not "
                f"{type(dupefilter).__qualname__}: set DUPEFILTER_CLASS = "
                f"\"crawlhub.contrib.scrapy.DupeFilter\"")
        self.df = dupefilter
        self.df.attached = True
        self.settings: CrawlSettings | None = None
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        self.queues: QueueBackend | None = None
        self.loop: LoopThread | None = None
        # reactor thread -> worker
        self._outbox: deque[_Item] = deque()
        # finished requests, each with the items received by then (see _settleable)
        self._done: deque[tuple[Seed, Outcome, int]] = deque()
        self._items: ItemSink | None = None
        # start-queue batches handed to the reactor (worker counts) and built (reactor)
        self._feeds_sent = 0
        self._feeds_built = 0
        # worker -> reactor thread
        self._ready: deque[Seed | Request] = deque()
        self._running: dict[Request, Seed] = {}
        self._failed: set[int] = set()  # ids of running requests whose callback failed
        self._busy = 0  # items the worker took and has not settled yet
        self._left = True  # the crawl owes requests (pending or leased, any spider)
        self._closing = False
        self._stopping = False  # the worker ends after its current step
        self._stop_beat: asyncio.Event | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._waits_logged = 0.0  # when the spider last said what it waits for
        self._event: asyncio.Event | None = None
        self._worker: Any = None
        self._idle_since: float | None = None
        self._warned_unserializable = False
        self._slot: Any = None
        self._sent: FixedBloom | None = None  # keys this spider sent (see _sent_before)
        self._sent_segment: int | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        return cls(crawler)

    # ------------------------------------------------------------------ lifecycle
    def open(self, spider: Spider) -> None:
        self.spider = spider
        self.settings = s = read_settings(self.crawler.settings, spider.name)
        self.df.configure(s)
        self.frontier = open_crawl_frontier(s)
        if s.start_queue:
            from crawlhub.queues import open_backend

            self.queues = open_backend(s.queues_url, prefix=s.prefix)
        self.loop = LoopThread(f"crawlhub-scheduler-{s.crawl}")
        try:
            self.loop.run(self._open())
        except BaseException:
            self.loop.stop()
            raise
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
        log.info("crawlhub scheduler: crawl %r on %s (key %s, lease %ss, prefetch %d%s)",
                 s.crawl, s.backend, s.key, s.lease, s.prefetch,
                 f", start queue {s.start_queue!r}" if s.start_queue else "",
                 extra={"spider": spider})

    async def _open(self) -> None:
        assert self.frontier is not None and self.settings is not None
        self._event = asyncio.Event()
        self._stop_beat = asyncio.Event()
        await self.frontier.open()
        if self.settings.flush_on_start:
            await self.frontier.store.purge()
            log.info("crawlhub scheduler: crawl %r flushed on start (SCHEDULER_FLUSH_ON_START)",
                     self.settings.crawl)

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

    def close(self, reason: str) -> None:
        if self.loop is None:
            return
        self._closing = True
        try:
            self.loop.run(self._close(reason), timeout=CLOSE_TIMEOUT + 30)
        except Exception:
            log.exception("crawlhub scheduler: closing crawl %r failed",
                          self.settings.crawl if self.settings else "?")
        finally:
            self.loop.stop()
            self.loop = None

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
        unstarted = [x for x in self._ready if isinstance(x, Seed)]
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

    # ------------------------------------------------------------------ engine side
    def has_pending_requests(self) -> bool:
        return bool(self._ready or self._outbox or self._done or self._busy
                    or self._feeds_sent != self._feeds_built or self._left)

    def enqueue_request(self, request: Request, *, ack: str | None = None) -> bool:
        """Queue ``request`` for admission (the frontier decides duplicates; one found
        later is counted as ``dupefilter/filtered`` and logged by the dupefilter)."""
        assert self.spider is not None
        if request.dont_filter:
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
            if not self._warned_unserializable:
                self._warned_unserializable = True
                log.warning("crawlhub scheduler: %s; such requests stay in this spider's"
                            " memory (not shared, lost if it is killed; only the first is"
                            " logged)", exc, extra={"spider": self.spider})
        seed.key = key
        self._outbox.append(_Item(seed, request, keep, ack))
        self.stats.inc_value("scheduler/enqueued/crawlhub")
        self.stats.inc_value("scheduler/enqueued")
        if len(self._outbox) == 1:
            self._wake()
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
        assert self.spider is not None
        while self._ready:
            item = self._ready.popleft()
            if isinstance(item, Seed):
                try:
                    data = dict(item.meta["r"])
                    data["url"] = item.url
                    request = request_from_data(data, self.spider)
                except Exception as exc:
                    log.error("crawlhub scheduler: stored request %s cannot be rebuilt (%s:"
                              " %s); it is finished as failed", item.url,
                              type(exc).__name__, exc, extra={"spider": self.spider})
                    self._done.append((item, "failed", 0))
                    self._wake()
                    continue
                self._running[request] = item
            else:
                request = item
            self.stats.inc_value("scheduler/dequeued/crawlhub")
            self.stats.inc_value("scheduler/dequeued")
            if len(self._ready) * 2 < self._prefetch:
                self._wake()
            self._idle_since = None
            return request
        self._wake()
        return None

    def __len__(self) -> int:
        return len(self._ready) + len(self._outbox)

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
        self._wake()

    def _on_error(self, failure: Any, response: Any, spider: Spider) -> None:
        request = getattr(response, "request", None)
        if request is not None and request in self._running:
            self._failed.add(id(request))

    def _on_idle(self, spider: Spider) -> None:
        from scrapy.exceptions import DontCloseSpider

        s = self.settings
        if s is None or self._closing:
            return
        if s.max_idle < 0:
            raise DontCloseSpider
        if s.max_idle > 0:
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            if now - self._idle_since < s.max_idle:
                raise DontCloseSpider

    def _log_dupes(self, requests: list[Request]) -> None:
        """(Reactor thread) the dupefilter logs and counts each filtered request."""
        spider = self.spider
        if spider is not None:
            for request in requests:
                self.df.log(request, spider)

    def _wake(self) -> None:
        loop, event = self.loop, self._event
        if loop is not None and event is not None and not event.is_set():
            loop.call_soon(event.set)

    def _nudge(self) -> None:
        """Have the engine ask for requests now (from the worker's thread)."""
        from twisted.internet import reactor

        slot = self._slot
        if slot is not None and not self._closing:
            reactor.callFromThread(slot.nextcall.schedule)  # type: ignore[attr-defined]

    def _stat(self, name: str, n: int = 1) -> None:
        from twisted.internet import reactor

        reactor.callFromThread(self.stats.inc_value, name, n)  # type: ignore[attr-defined]

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
            self._event.clear()
            try:
                progressed = await self._cycle()
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
                failing = True
                await self._pause(BACKOFF)
                continue
            if progressed:
                continue
            await self._pause(POLL)

    async def _cycle(self) -> bool:
        """Store what was enqueued, finish what is done, lease ahead; True if anything
        moved."""
        progressed = await self._settle()
        progressed = await self._fill() or progressed
        return progressed

    async def _settle(self) -> bool:
        """Admit the enqueued requests, then finish the done ones: a request's children
        are stored before it is finished. On failure both are put back."""
        assert self.frontier is not None
        n_done, n_out = self._settleable(), len(self._outbox)
        if not n_done and not n_out:
            return False
        self._busy += n_done + n_out
        try:
            done = [self._done.popleft() for _ in range(n_done)]
            items = [self._outbox.popleft() for _ in range(n_out)]
            try:
                await self._admit(items)
            except BaseException:
                self._outbox.extendleft(reversed(items))
                self._done.extendleft(reversed(done))
                raise
            for i, (seed, outcome, _) in enumerate(done):
                try:
                    await self.frontier.finish(seed, outcome)
                except BaseException:
                    self._done.extendleft(reversed(done[i:]))
                    raise
        finally:
            # What was just admitted or finished may have changed what the crawl owes
            # (a start request found duplicate leaves this spider with nothing local):
            # the verdict of an earlier look at the store no longer holds, so the crawl
            # counts as owing until _fill looks again. Left False from a look taken before
            # another spider admitted the start URL, it closed this spider early.
            self._left = True
            self._busy -= n_done + n_out
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
        for x in items:
            if not flags[id(x)]:
                dupes.append(x.request)
            elif x.keep:
                self._ready.append(x.request)
        if dupes:
            from twisted.internet import reactor

            reactor.callFromThread(self._log_dupes, dupes)  # type: ignore[attr-defined]
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
        """Lease up to the prefetch; feed the start queue when the crawl runs dry."""
        assert self.frontier is not None and self.settings is not None
        if self._closing:
            return False
        s = self.settings
        want = s.prefetch - len(self._ready)
        if want <= 0:
            return False
        seeds = await self.frontier.lease(want, s.lease)
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
            self._ready.extend(usable)
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

    async def _log_wait(self, seconds: float) -> None:
        """Nothing to crawl here while the crawl still owes requests: say what the spider
        waits for (once, then every ``WAIT_LOG_EVERY`` s while it waits)."""
        assert self.frontier is not None and self.settings is not None
        mono = time.monotonic()
        if mono - self._waits_logged < WAIT_LOG_EVERY:
            return
        self._waits_logged = mono
        counts = await self.frontier.stats()
        leased = sum(int(c.get("leased", 0)) for c in counts)
        waiting = sum(int(c.get("pending", 0)) for c in counts)
        log.info("crawlhub scheduler: crawl %r waits for %d requests leased by other spiders"
                 " (%d more wait for their time); the next is free in %.1f s (a spider"
                 " that stops beating loses its leases %ss after its last beat,"
                 " CRAWLHUB_LEASE)", self.settings.crawl, leased, waiting, seconds,
                 self.settings.lease, extra={"spider": self.spider})

    async def _feed(self, want: int) -> bool:
        """Lease tasks from the start queue and hand them to the reactor to build."""
        if self.queues is None or not self.settings or not self.settings.start_queue:
            return False
        queue = self.queues.queue(self.settings.start_queue)
        messages = await queue.lease(min(want, 100), self.settings.lease)
        if not messages:
            return False
        self._feeds_sent += 1
        from twisted.internet import reactor

        reactor.callFromThread(self._build_tasks, messages)  # type: ignore[attr-defined]
        return True

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
        if bad and self.loop is not None and self.queues is not None and self.settings:
            queue = self.queues.queue(self.settings.start_queue or "")
            for receipt, reason in bad:
                log.error("crawlhub scheduler: start task %s refused: %s", receipt, reason)
                self.loop.submit(queue.nack([receipt], dead=True, reason=reason))
        self._wake()

    def _held(self) -> list[Seed]:
        """The seeds this spider holds leases of: running, leased ahead, and finished but
        waiting for their items' commit."""
        return (list(self._running.values())
                + [x for x in list(self._ready) if isinstance(x, Seed)]
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

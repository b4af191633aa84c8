"""``DUPEFILTER_CLASS = "crawlhub.contrib.scrapy.DupeFilter"``: request keys and dedup.

With crawlhub's :class:`~crawlhub.contrib.scrapy.Scheduler` the frontier decides what is
a duplicate (atomically, across every spider of the crawl) and this class only keys
requests and logs the filtered ones. Under another scheduler (Scrapy's own) it is a
shared, persistent dupefilter on its own: ``request_seen`` asks the crawl's frontier,
so spiders on one Redis never fetch a URL twice in a time segment.

Alone it keeps Scrapy's dupefilter contract: with ``SCHEDULER_PERSIST`` off (the
default without ``JOBDIR``) it forgets what it saw when it closes, as Scrapy's in-memory
filter does; ``SCHEDULER_FLUSH_ON_START`` forgets before the first request.

Keys: ``CRAWLHUB_KEY = "fingerprint"`` (default) is the crawler's request fingerprinter
(``REQUEST_FINGERPRINTER_CLASS``), exactly Scrapy's notion of a duplicate; a custom
fingerprinter wins whenever the project sets one. ``"canonical"`` resolves the
frontier's key rules (canonical URL, volatile parameters dropped, method and body
included).

Duplicates are logged as Scrapy's dupefilter logs them, on the ``scrapy.dupefilters``
logger (``DUPEFILTER_DEBUG``: every one, with its referer).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from crawlhub.frontier.seed import Seed
from crawlhub.frontier.urlkeys import KeyResolver

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from crawlhub.contrib.scrapy.loop import LoopThread
    from crawlhub.contrib.scrapy.settings import CrawlSettings
    from crawlhub.frontier import Frontier

log = logging.getLogger("crawlhub.contrib.scrapy")
#: Scrapy's dupefilter logger: projects filter and route duplicate lines by its name.
dupes_log = logging.getLogger("scrapy.dupefilters")
#: Keys remembered by request (method, URL, body) under Scrapy's default fingerprinter;
#: the memo starts over when it holds this many (about 250 bytes each).
KEYS_MEMO = 50_000


class PresetKeys(KeyResolver):
    """The frontier's key rules, except that a seed arriving with its key keeps it (the
    key the dupefilter gave its request, or a unique one for ``dont_filter``)."""

    def key(self, seed: Seed | str) -> str:
        if isinstance(seed, Seed) and seed.key:
            return seed.key
        return super().key(seed)


def open_crawl_frontier(settings: CrawlSettings, *, archive: bool | None = None) -> Frontier:
    """The crawl's frontier (not opened yet), keying seeds by the key their request came
    with (:class:`PresetKeys`); ``archive`` over the settings' (the standalone filter
    keeps every record)."""
    from crawlhub.frontier import Frontier
    from crawlhub.frontier.open import open_store

    fc = settings.frontier
    store = open_store(settings.frontier_url, settings.crawl, prefix=settings.prefix,
                       expected_items=fc.expected_items, fp_rate=fc.fp_rate,
                       archive=fc.archive if archive is None else archive,
                       lifo=settings.order == "lifo")
    return Frontier(settings.crawl, store, fc, keys=PresetKeys(fc.key))


class DupeFilter:
    """Keys Scrapy requests the way the crawl's frontier dedups them."""

    def __init__(self, crawler: Crawler | None = None, *, debug: bool = False) -> None:
        self.crawler = crawler
        self.debug = debug
        self.logdupes = True
        self._resolver: KeyResolver | None = None
        self._fingerprinter: Any = None
        # the keys of requests Scrapy's default fingerprinter saw, by what it hashes
        # (None: another fingerprinter, which may look at anything)
        self._memo: dict[tuple[str, str, bytes, bool], str] | None = None
        # set when this filter stands alone (not under crawlhub's scheduler)
        self._own: tuple[LoopThread, Frontier] | None = None
        self._settings: CrawlSettings | None = None
        self.attached = False
        self._counts: tuple[Any, Any] | None = None  # (spider, its stats' inc_value)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DupeFilter:
        return cls(crawler, debug=crawler.settings.getbool("DUPEFILTER_DEBUG"))

    def configure(self, settings: CrawlSettings) -> None:
        """Key by ``settings`` (the scheduler calls this before any request)."""
        self._resolver = KeyResolver(settings.frontier.key)
        self._fingerprinter = self._memo = None
        if settings.key != "fingerprint":
            return
        from scrapy.utils.request import RequestFingerprinter, fingerprint

        fingerprinter: Any
        if self.crawler is None:  # alone, no project: Scrapy's default fingerprint
            fingerprinter = RequestFingerprinter()
        else:
            fingerprinter = getattr(self.crawler, "request_fingerprinter", None)
            if fingerprinter is None:  # a crawler not started yet: build the project's
                from scrapy.utils.misc import build_from_crawler, load_object

                fingerprinter = build_from_crawler(
                    load_object(self.crawler.settings["REQUEST_FINGERPRINTER_CLASS"]),
                    self.crawler)
        self._fingerprinter = fingerprinter
        if (type(fingerprinter) is RequestFingerprinter
                and getattr(fingerprinter, "_fingerprint", None) is fingerprint):
            self._memo = {}

    def key(self, request: Request) -> str:
        """The dedup key of ``request``."""
        memo = self._memo
        if memo is not None:
            # Scrapy's default fingerprint hashes the method, the URL (canonical unless
            # meta verbatim_url) and the body, nothing else: a request like one keyed
            # before has its key. A spider enqueues the links of its pages again and
            # again; hashing a canonical URL costs more than the rest of an enqueue.
            seen = (request.method, request.url, request.body,
                    bool(request.meta.get("verbatim_url")))
            key = memo.get(seen)
            if key is None:
                key = self._fingerprinter.fingerprint(request).hex()
                if len(memo) >= KEYS_MEMO:
                    memo.clear()
                memo[seen] = key
            return key
        if self._fingerprinter is not None:
            fp = self._fingerprinter.fingerprint(request)
            return fp.hex() if isinstance(fp, bytes) else str(fp)
        if self._resolver is None:
            self._resolver = KeyResolver()
        body = request.body or None
        return self._resolver.key(Seed(request.url, method=request.method, body=body))

    # ------------------------------------------------------------------ standalone
    def open(self) -> None:
        """Alone (Scrapy's scheduler calls this): open the crawl's frontier."""
        if self.attached or self._own is not None or self.crawler is None:
            return
        from crawlhub.contrib.scrapy.loop import LoopThread
        from crawlhub.contrib.scrapy.settings import read_settings

        spider = getattr(self.crawler, "spider", None)
        settings = read_settings(self.crawler.settings, spider.name if spider else "default")
        self.configure(settings)
        self._settings = settings
        frontier = open_crawl_frontier(settings, archive=True)
        loop = LoopThread(f"crawlhub-dupefilter-{settings.crawl}")
        try:
            loop.run(frontier.open())
            if settings.flush_on_start:
                loop.run(frontier.store.purge())
        except BaseException:
            loop.stop()
            raise
        self._own = (loop, frontier)

    def request_seen(self, request: Request) -> bool:
        """Alone: True when the crawl admitted this request's key already (in this time
        segment, by any spider). Under crawlhub's scheduler the frontier decides and this
        is not called."""
        if self._own is None:
            self.open()
        if self._own is None:
            raise RuntimeError("crawlhub DupeFilter.request_seen needs a crawler")
        loop, frontier = self._own
        seed = Seed(request.url, method=request.method)
        seed.key = self.key(request)
        (admitted,) = loop.run(frontier.admit([seed], dispatched=True))
        return not admitted

    def close(self, reason: str = "") -> None:
        """Alone: without ``SCHEDULER_PERSIST`` what the filter saw is forgotten (whatever
        the reason: Scrapy's own scheduler loses its queue on any close, so a seen URL kept
        would never be fetched by the next run)."""
        if self._own is not None:
            loop, frontier = self._own
            self._own = None
            try:
                if self._settings is not None and not self._settings.persist:
                    loop.run(frontier.store.purge(), timeout=30)
                loop.run(frontier.close(), timeout=30)
            finally:
                loop.stop()

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug:
            referer = request.headers.get("Referer")
            dupes_log.debug("Filtered duplicate request: %(request)s (referer: %(referer)s)",
                            {"request": request,
                             "referer": referer.decode("utf-8", "replace") if referer else None},
                            extra={"spider": spider})
        elif self.logdupes:
            dupes_log.debug("Filtered duplicate request: %(request)s - no more duplicates will"
                            " be shown (see DUPEFILTER_DEBUG to show all duplicates)",
                            {"request": request}, extra={"spider": spider})
            self.logdupes = False
        counts = self._counts
        if counts is None or counts[0] is not spider:  # looked up once per spider
            stats = getattr(getattr(spider, "crawler", None), "stats", None)
            counts = self._counts = (spider, None if stats is None else stats.inc_value)
        if counts[1] is not None:
            counts[1]("dupefilter/filtered")

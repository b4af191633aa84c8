"""``DUPEFILTER_CLASS = "crawlhub.contrib.scrapy.DupeFilter"``: request keys and dedup.

With crawlhub's :class:`~crawlhub.contrib.scrapy.Scheduler` the frontier decides what is
a duplicate (atomically, across every spider of the crawl) and this class only keys
requests and logs the filtered ones. Under another scheduler (Scrapy's own) it is a
shared, persistent dupefilter on its own: ``request_seen`` asks the crawl's frontier,
so spiders on one Redis never fetch a URL twice in a time segment.

Keys: ``CRAWLHUB_KEY = "canonical"`` (default) resolves the frontier's key rules
(canonical URL, volatile parameters dropped, method and body included); ``"fingerprint"``
is Scrapy's request fingerprinter, for exactly Scrapy's notion of a duplicate.
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
                       archive=fc.archive if archive is None else archive)
    return Frontier(settings.crawl, store, fc, keys=PresetKeys(fc.key))


class DupeFilter:
    """Keys Scrapy requests the way the crawl's frontier dedups them."""

    def __init__(self, crawler: Crawler | None = None, *, debug: bool = False) -> None:
        self.crawler = crawler
        self.debug = debug
        self.logdupes = True
        self._resolver: KeyResolver | None = None
        self._fingerprinter: Any = None
        # set when this filter stands alone (not under crawlhub's scheduler)
        self._own: tuple[LoopThread, Frontier] | None = None
        self.attached = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DupeFilter:
        return cls(crawler, debug=crawler.settings.getbool("DUPEFILTER_DEBUG"))

    def configure(self, settings: CrawlSettings) -> None:
        """Key by ``settings`` (the scheduler calls this before any request)."""
        self._resolver = KeyResolver(settings.frontier.key)
        if settings.key == "fingerprint":
            if self.crawler is None or getattr(self.crawler, "request_fingerprinter", None) is None:
                from crawlhub.core.errors import ConfigError

                raise ConfigError("Scrapy setting CRAWLHUB_KEY: 'fingerprint' needs a crawler"
                                  " with a request fingerprinter (Scrapy >= 2.7)",
                                  key="CRAWLHUB_KEY")
            self._fingerprinter = self.crawler.request_fingerprinter

    def key(self, request: Request) -> str:
        """The dedup key of ``request``."""
        if self._fingerprinter is not None:
            return str(self._fingerprinter.fingerprint(request).hex())
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

        spider = self.crawler.spider
        settings = read_settings(self.crawler.settings, spider.name if spider else "default")
        self.configure(settings)
        frontier = open_crawl_frontier(settings, archive=True)
        loop = LoopThread(f"crawlhub-dupefilter-{settings.crawl}")
        loop.run(frontier.open())
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
        if self._own is not None:
            loop, frontier = self._own
            self._own = None
            try:
                loop.run(frontier.close(), timeout=30)
            finally:
                loop.stop()

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug:
            log.debug("Filtered duplicate request: %s", request, extra={"spider": spider})
        elif self.logdupes:
            log.debug("Filtered duplicate request: %s - no more duplicates will be shown"
                      " (see DUPEFILTER_DEBUG to show all duplicates)", request,
                      extra={"spider": spider})
            self.logdupes = False
        stats = getattr(getattr(spider, "crawler", None), "stats", None)
        if stats is not None:
            stats.inc_value("dupefilter/filtered")

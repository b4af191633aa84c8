"""Scrapy on crawlhub: a scheduler and dupefilter on the frontier and reliable queues.

In a Scrapy project's settings (or with ``-s`` on the command line)::

    SCHEDULER = "crawlhub.contrib.scrapy.Scheduler"
    DUPEFILTER_CLASS = "crawlhub.contrib.scrapy.DupeFilter"
    CRAWLHUB_URL = "redis://127.0.0.1:6379/0"   # or a data directory (embedded)

No spider changes. See :mod:`crawlhub.contrib.scrapy.settings` for every setting and
``docs/scrapy-redis-migration.md`` for scrapy-redis's settings side by side.

Downloads through the download center: ``CenterDownloadHandler`` and
``CenterSpiderMiddleware`` (:mod:`crawlhub.contrib.scrapy.center`, imported on first use:
it imports Scrapy and Twisted).

Items committed before their requests finish: ``ItemSink`` in ``ITEM_PIPELINES`` with
``CRAWLHUB_ITEMS`` (:mod:`crawlhub.contrib.scrapy.items`): a killed spider's uncommitted
items are produced again by the spider that takes its requests, written once by key.

Run as a crawlhub job: ``CrawlhubControl`` (:mod:`crawlhub.contrib.scrapy.extension`,
``EXTENSIONS = {"crawlhub.contrib.scrapy.extension.CrawlhubControl": 500}``) pauses,
continues and ends the spider through the job's control channel and reports Scrapy's
stats as the run's counters.
"""

from typing import Any

from crawlhub.contrib.scrapy.dupefilter import DupeFilter
from crawlhub.contrib.scrapy.scheduler import Scheduler

__all__ = ["CenterDownloadHandler", "CenterSpiderMiddleware", "CrawlhubControl", "DupeFilter",
           "ItemSink", "Scheduler"]

_CENTER = ("CenterDownloadHandler", "CenterSpiderMiddleware")


def __getattr__(name: str) -> Any:
    if name in _CENTER:
        from crawlhub.contrib.scrapy import center

        return getattr(center, name)
    if name == "ItemSink":
        from crawlhub.contrib.scrapy.items import ItemSink

        return ItemSink
    if name == "CrawlhubControl":
        from crawlhub.contrib.scrapy.extension import CrawlhubControl

        return CrawlhubControl
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Pause, continue and exit for a Scrapy spider run as a crawlhub job, and its stats as
the run's counters.

In a Scrapy project's settings (or with ``-s`` on the command line)::

    EXTENSIONS = {"crawlhub.contrib.scrapy.extension.CrawlhubControl": 500}

The job runner gives the process its control and counters files (``CRAWLHUB_CONTROL_FILE``,
``CRAWLHUB_COUNTERS_FILE``; the Scrapy settings of the same names win). Without either the
extension stays off (``NotConfigured``), so a project can enable it for good.

- every ``CRAWLHUB_CONTROL_INTERVAL`` s (0.2) it reads :func:`crawlhub.sdk.control`:
  ``pause`` pauses the engine (no new request is scheduled; those in flight finish and
  their callbacks run), ``run`` unpauses it, ``exit`` closes the spider with reason
  ``crawlhub_exit`` (what is in flight finishes, as on Ctrl-C);
- every ``CRAWLHUB_STATS_INTERVAL`` s (1) Scrapy's numeric stats
  (``item_scraped_count``, ``downloader/request_count``, ``response_received_count``...)
  become the run's counters under the same names; once more when the spider closes,
  then with Scrapy's final stats as ScrapydWeb shows them: ``finish_reason`` (text) and
  ``elapsed_time_seconds`` (taken from ``start_time`` when Scrapy's CoreStats has not
  set it yet: the order of the extensions' ``spider_closed`` handlers is not fixed). The
  run's page shows them with ``log_count/ERROR`` and the responses per status
  (``downloader/response_status_count/<code>``).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from typing import Any, cast

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet import task

from crawlhub import sdk
from crawlhub.core.jobprotocol import ENV_CONTROL_FILE, ENV_COUNTERS_FILE, EXIT, PAUSE, RUN

log = logging.getLogger("crawlhub.contrib.scrapy.extension")

#: Reason a spider closed on an exit request.
EXIT_REASON = "crawlhub_exit"


class CrawlhubControl:
    """The extension; see the module docstring."""

    def __init__(self, crawler: Any, control: sdk.Control, counters: sdk.Counters, *,
                 interval: float = 0.2, stats_interval: float = 1.0) -> None:
        self.crawler = crawler
        self.control = control
        self.counters = counters
        self.interval = interval
        self.stats_interval = stats_interval
        self.paused = False
        self.exiting = False
        self._spider: Any = None
        self._loop: task.LoopingCall | None = None
        self._stats_due = 0.0

    @classmethod
    def from_crawler(cls, crawler: Any) -> CrawlhubControl:
        settings = crawler.settings
        control_file = settings.get("CRAWLHUB_CONTROL_FILE") or os.environ.get(ENV_CONTROL_FILE)
        counters_file = (settings.get("CRAWLHUB_COUNTERS_FILE")
                         or os.environ.get(ENV_COUNTERS_FILE))
        if not control_file and not counters_file:
            raise NotConfigured("no CRAWLHUB_CONTROL_FILE or CRAWLHUB_COUNTERS_FILE: not run"
                                " by a crawlhub job runner")
        control = sdk.Control.from_file(control_file) if control_file else sdk.Control()
        if counters_file and counters_file == os.environ.get(ENV_COUNTERS_FILE):
            counters = sdk.process_counters()  # shared with the spider's own sdk.count()
        else:
            counters = sdk.Counters(counters_file or None)
        ext = cls(crawler, control, counters,
                  interval=settings.getfloat("CRAWLHUB_CONTROL_INTERVAL", 0.2),
                  stats_interval=settings.getfloat("CRAWLHUB_STATS_INTERVAL", 1.0))
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider: Any) -> None:
        self._spider = spider
        self._loop = task.LoopingCall(self.tick)
        self._loop.start(self.interval, now=True).addErrback(
            lambda failure: log.error("crawlhub control stopped: %s", failure.value))

    def spider_closed(self, spider: Any, reason: str) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        self.report_stats(reason=reason)
        self.counters.flush()

    def tick(self) -> None:
        """One look at the control (a stat at most) and, when due, the stats copied."""
        engine = self.crawler.engine
        state = self.control.state
        if engine is not None and not self.exiting:
            if state == EXIT:
                self.exiting = True
                # paused or not: the requests in flight finish and their callbacks run
                log.info("crawlhub: exit requested; closing the spider (%s)", EXIT_REASON)
                self._close(engine)
            elif state == PAUSE and not self.paused:
                engine.pause()
                self.paused = True
                log.info("crawlhub: paused; requests in flight finish, no new ones start")
            elif state == RUN and self.paused:
                engine.unpause()
                self.paused = False
                log.info("crawlhub: continued")
            if self.paused and state == PAUSE and not in_flight(engine):
                # the runner holds a job that does not say it holds still (SIGSTOP after
                # a second): say it once the requests in flight and their callbacks ended
                self.control.acknowledge()
        now = time.monotonic()
        if now >= self._stats_due:
            self._stats_due = now + self.stats_interval
            self.report_stats()

    def report_stats(self, reason: str | None = None) -> None:
        """Scrapy's numeric stats as the run's counters; with ``reason`` (the spider
        closed) its final ones too: ``finish_reason`` and ``elapsed_time_seconds``."""
        stats = self.crawler.stats.get_stats()
        values: dict[str, Any] = {
            str(k): v for k, v in stats.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}
        if reason is not None:
            values["finish_reason"] = str(reason)
            started = stats.get("start_time")
            if "elapsed_time_seconds" not in values and isinstance(started, datetime):
                now = datetime.now(UTC)  # Scrapy's start_time is UTC (naive before 2.11)
                now = now if started.tzinfo else now.replace(tzinfo=None)
                values["elapsed_time_seconds"] = round((now - started).total_seconds(), 3)
        # the counters file carries text too (the runner keeps str values; the run's
        # page shows them): finish_reason is one
        self.counters.update(cast(dict[str, float], values))

    def _close(self, engine: Any) -> None:
        close_async = getattr(engine, "close_spider_async", None)
        if close_async is not None:  # Scrapy 2.14+
            from scrapy.utils.defer import deferred_from_coro

            deferred_from_coro(close_async(reason=EXIT_REASON))
        else:
            engine.close_spider(self._spider, EXIT_REASON)


def in_flight(engine: Any) -> int:
    """Requests the engine is downloading plus responses whose callbacks still run."""
    downloader = getattr(engine, "downloader", None)
    slot = getattr(getattr(engine, "scraper", None), "slot", None)
    return len(getattr(downloader, "active", ()) or ()) + len(getattr(slot, "active", ()) or ())

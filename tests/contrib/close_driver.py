"""Opens crawlhub's Scrapy scheduler, enqueues requests and closes it at once, ``TRIES``
times; prints one JSON line per try: how many of the requests the crawl kept, what
``close()`` raised and how long it took. Run as a process of its own by
test_scrapy_scheduler (asyncio's "Task was destroyed" warnings go to its stderr).

The engine here is only what the scheduler touches of it (a slot whose
``remove_request`` it wraps); no reactor runs, so no request is ever handed out.

``python close_driver.py <CRAWLHUB_URL> <crawl> <tries> <requests>``
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from types import SimpleNamespace

import scrapy
from scrapy.utils.test import get_crawler

from crawlhub.contrib.scrapy import Scheduler
from crawlhub.contrib.scrapy.dupefilter import open_crawl_frontier
from crawlhub.contrib.scrapy.settings import read_settings


class Quiet(scrapy.Spider):
    name = "quiet"


def one_try(url: str, crawl: str, n: int) -> dict[str, object]:
    settings = {"CRAWLHUB_URL": url, "CRAWLHUB_CRAWL": crawl, "CRAWLHUB_PREFIX": f"{crawl}:",
                "SCHEDULER_PERSIST": True, "CRAWLHUB_START_QUEUE": "",
                "DUPEFILTER_CLASS": "crawlhub.contrib.scrapy.DupeFilter"}
    crawler = get_crawler(Quiet, settings)
    spider = Quiet.from_crawler(crawler)
    crawler.spider = spider
    slot = SimpleNamespace(remove_request=lambda request: None,
                           nextcall=SimpleNamespace(schedule=lambda: None))
    crawler.engine = SimpleNamespace(_slot=slot)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(spider)
    time.sleep(0.3)  # the worker is waiting for work, as in a crawl
    for i in range(n):
        scheduler.enqueue_request(scrapy.Request(f"http://127.0.0.1:9/{crawl}/{i}"))
    began = time.monotonic()
    error = None
    try:
        scheduler.close("shutdown")
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        error = f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - began

    async def kept() -> int:
        frontier = open_crawl_frontier(read_settings(crawler.settings, "quiet"))
        async with frontier:
            return sum(s["pending"] for s in await frontier.stats())

    return {"kept": asyncio.run(kept()), "error": error, "seconds": round(took, 2)}


def main() -> None:
    url, crawl, tries, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    for i in range(tries):
        print(json.dumps(one_try(url, f"{crawl}-{i}", n)), flush=True)


if __name__ == "__main__":
    main()

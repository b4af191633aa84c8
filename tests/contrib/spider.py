"""The spider of the Scrapy scheduler tests, run as ``scrapy runspider`` in a process of
its own. Nothing in it knows crawlhub: the scheduler comes from the settings only.

It follows every link of the test site and writes each page it parsed as one flushed
JSON line to ``$ITEMS`` (before its links are yielded, so a page whose request was
finished has its line on disk). ``$START`` holds the start URLs (plain requests, so two
spiders starting one crawl fetch page 0 once); ``$FORM`` adds a POST with a callback,
meta, headers and a cookie, whose answer is checked in ``after_post``. With ``$GATE`` the
spider loads, touches ``$GATE.ready`` and waits for the file ``$GATE`` before it starts.
"""

from __future__ import annotations

import json
import os
from typing import Any

import scrapy


class LinkSpider(scrapy.Spider):
    name = "links"

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Any:
        gate = os.environ.get("GATE")
        if gate:  # started ahead of its turn: loaded, then held before it opens the crawl
            import time
            from pathlib import Path

            from scrapy.utils.misc import load_object

            for name in ("SCHEDULER", "DUPEFILTER_CLASS"):
                load_object(crawler.settings[name])
            Path(gate + ".ready").touch()
            while not os.path.exists(gate):
                time.sleep(0.02)
        return super().from_crawler(crawler, *args, **kwargs)

    async def start(self) -> Any:
        if os.environ.get("START_DELAY"):  # the scheduler looks at the crawl first
            import asyncio

            await asyncio.sleep(float(os.environ["START_DELAY"]))
        for request in self.start_requests():
            yield request

    def start_requests(self) -> Any:
        for url in os.environ.get("START", "").split():
            yield scrapy.Request(url, dont_filter=bool(os.environ.get("START_DONT_FILTER")))
        if os.environ.get("FORM"):
            yield scrapy.Request(
                os.environ["FORM"], method="POST", body=b'{"q": "caf\xc3\xa9"}',
                headers={"Content-Type": "application/json", "X-Test": "kept"},
                cookies={"session": "s1"}, priority=5,
                meta={"tag": ["a", 1, {"deep": True}], "raw": b"\x00\xff"},
                cb_kwargs={"expect": "café"}, callback=self.after_post)

        if os.environ.get("ODD"):  # meta JSON cannot hold: kept in this spider's memory
            yield scrapy.Request(os.environ["ODD"], meta={"obj": object()},
                                 callback=self.after_odd)

    def after_odd(self, response: Any) -> None:
        self.record({"url": response.url, "odd": True, "pid": os.getpid()})

    def record(self, row: dict[str, Any]) -> None:
        with open(os.environ["ITEMS"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()

    def parse(self, response: Any) -> Any:
        self.record({"url": response.url, "title": response.css("title::text").get(),
                     "pid": os.getpid()})
        yield {"url": response.url}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def after_post(self, response: Any, expect: str) -> Any:
        echoed = json.loads(response.text)
        self.record({"url": response.url, "post": echoed, "expect": expect,
                     "meta": {"tag": response.meta.get("tag"),
                              "raw": list(response.meta.get("raw", b""))},
                     "priority": response.request.priority, "pid": os.getpid()})


class EnvSegments:
    """A segment resolver for tests: the segment is ``$SEGMENT`` (so a test moves a
    crawl to its next segment without waiting a day); every segment is open."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds

    def segment_of(self, seed: Any, now: float) -> int:
        return int(os.environ.get("SEGMENT", "1"))

    def start_of(self, segment: int) -> float:
        return 0.0

    def label(self, segment: int) -> str:
        return f"run {segment}"

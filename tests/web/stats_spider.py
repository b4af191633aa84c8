"""The spider of the run page's Scrapy stats test, run by a crawlhub job as
``scrapy runspider``: it follows the test site's links from ``$START`` and fetches
``$MISSING`` (a 404); page 3's callback raises, so the run has an ERROR logged. Nothing
in it knows crawlhub: the extension comes from the settings."""

from __future__ import annotations

import os
from typing import Any

import scrapy


class StatsSpider(scrapy.Spider):
    name = "stats"

    async def start(self) -> Any:
        yield scrapy.Request(os.environ["START"])
        yield scrapy.Request(os.environ["MISSING"])

    def parse(self, response: Any) -> Any:
        if response.url.endswith("/page/3"):
            raise ValueError("page 3 is broken on purpose")
        yield {"url": response.url}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

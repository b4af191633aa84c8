"""The spider of ``bench/scrapy_scheduler.py``: follows every link of the synthetic site
and yields ``{url, title}``. It knows neither scheduler; the settings pick one."""

from __future__ import annotations

import os
from typing import Any

import scrapy


class SiteSpider(scrapy.Spider):
    name = "site"

    async def start(self) -> Any:
        yield scrapy.Request(os.environ["START"])

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "title": response.css("title::text").get()}
        yield from response.follow_all(css="a", callback=self.parse)

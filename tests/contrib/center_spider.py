"""A link-following spider for the download center tests (``scrapy runspider`` in a
subprocess). ``$START`` holds the start URLs; every response is recorded in ``$ITEMS``
(one JSON line: its URL, the agent that downloaded it, the agent of the page its
request was found on, passed along in ``cb_kwargs``, and the reactor's class)."""

from __future__ import annotations

import json
import os
from typing import Any

import scrapy


class CenterSpider(scrapy.Spider):
    name = "center-links"

    async def start(self) -> Any:
        for request in self.start_requests():
            yield request

    def start_requests(self) -> Any:
        for url in os.environ.get("START", "").split():
            yield scrapy.Request(url, cb_kwargs={"parent": None})

    def parse(self, response: Any, parent: str | None) -> Any:
        from twisted.internet import reactor

        agent = response.meta.get("crawlhub_agent")
        kind = type(reactor)
        with open(os.environ["ITEMS"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"url": response.url, "agent": agent, "parent": parent,
                                 "status": response.status,
                                 "reactor": f"{kind.__module__}.{kind.__qualname__}",
                                 "title": response.css("title::text").get()}) + "\n")
        yield {"url": response.url}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse, cb_kwargs={"parent": agent})

"""Downloads of a ``crawlhub crawl`` (or any :class:`~crawlhub.agents.agent.Agent`) through
the download center: what the agent's downloader does, done by the center's agents.

:class:`CenterDownloader` stands where the agent's :class:`~crawlhub.agents.downloader.
Downloader` does (``remote = True`` tells the agent to hand it the whole task): each
fetch becomes a :meth:`CenterClient.fetch`, the agent that downloaded comes back in
``Fetched.agent`` (chained: the links found on the page carry it as ``center_agent`` and
go back to that agent), and what the agent extracted in ``Fetched.extracted``. A
``skipped`` or ``failed`` reply is a ``connection_error`` for the hub's retry rules; a
:class:`CenterError` (the center unanswered past its retries, the broker gone) is fatal:
``fatal`` holds it, ``on_fatal`` is called (the crawl stops) and the fetch reports a
connection error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from crawlhub.agents.codes import CONNECTION_ERROR, PARSE_ERROR
from crawlhub.agents.config import RenderWait
from crawlhub.agents.downloader import DownloaderConfig, Fetched
from crawlhub.agents.extract import Extracted
from crawlhub.center.client import CenterClient
from crawlhub.center.messages import CenterError
from crawlhub.fetch.http import Request

log = logging.getLogger("crawlhub.center.downloader")

#: Key of a task (and of the link tasks found on its page) naming the agent that
#: downloaded the page: chained follow-ups go back to it.
AGENT_KEY = "center_agent"


class CenterDownloader:
    """A downloader whose fetches go through ``client`` (opened: agents allocated)."""

    remote = True

    def __init__(self, client: CenterClient, config: DownloaderConfig | None = None, *,
                 extracts: bool = True, close_bus: bool = False,
                 on_fatal: Callable[[CenterError], Any] | None = None) -> None:
        self.client = client
        self.close_bus = close_bus
        self.config = config or DownloaderConfig()
        self.extracts = extracts
        self.on_fatal = on_fatal
        self.fatal: CenterError | None = None
        self.requests = 0

    async def fetch(self, request: Request | str, *, job: str = "",
                    task: Mapping[str, Any] | None = None,
                    render: RenderWait | None = None) -> Fetched:
        """``request`` downloaded by one of the center's agents (``render``: rendered in
        its headless Chromium with these waits)."""
        req = Request(request) if isinstance(request, str) else request
        task = task or {}
        self.requests += 1
        try:
            reply = await self.client.fetch(
                req, agent=str(task.get(AGENT_KEY) or "") or None,
                extract=task.get("extract"), depth=int(task.get("depth") or 0),
                render=None if render is None else render.model_dump())
        except CenterError as exc:
            if self.fatal is None:
                self.fatal = exc
                log.error("%s", exc)
                if self.on_fatal is not None:
                    self.on_fatal(exc)
            return Fetched(req.url, req.url, 0, {}, b"", 0.0, None, CONNECTION_ERROR,
                           error=str(exc))
        if not reply.ok:
            return Fetched(req.url, req.url, 0, {}, b"", 0.0, None, CONNECTION_ERROR,
                           error=f"center: {reply.status}: {reply.error}", agent=reply.agent)
        fetched = Fetched(req.url, reply.url or req.url, reply.http_status, reply.headers,
                          reply.body, reply.elapsed, None, reply.outcome or CONNECTION_ERROR,
                          error=reply.error, agent=reply.agent)
        if self.extracts and reply.fields is not None and fetched.outcome != PARSE_ERROR:
            fetched.extracted = Extracted(reply.fields, list(reply.links or []), reply.title)
        return fetched

    def stats(self) -> dict[str, Any]:
        return self.client.stats()

    async def close(self) -> None:
        try:
            await self.client.close()
        finally:
            if self.close_bus:
                await self.client.bus.close()

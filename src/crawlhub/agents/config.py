"""The ``agent`` config section: how ``crawlhub agent`` downloads, what its results are
called, how polite it is and where its items go. Command-line options override it.

    agent:
      queues: [pages]             # default: every queue outbound
      concurrency: 64
      lease: 120                  # seconds a leased task stays this agent's
      downloader:                 # crawlhub.agents.downloader.DownloaderConfig
        timeout: 30
        max_size: 10485760
        max_redirects: 10
        headers: {User-Agent: "mybot/1.0 (+https://example.com/bot)"}
        ban: {statuses: [403], body_regex: "captcha", cooldown: 600}
        proxies: {urls: ["http://127.0.0.1:3128"], cooldown: 300}
      result_codes: {timeout: 2001, statuses: {404: 1000}}
      politeness: {per_domain: 2, delay: 0.5, robots: true, adaptive: false}
      render: {concurrency: 4, wait_for: "#app[data-ready]"}   # tasks with render: true
      sink: {type: jsonl, path: items.jsonl, key: [url]}
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from crawlhub.agents.browser import RenderConfig
from crawlhub.agents.codes import ResultCodes
from crawlhub.agents.downloader import DownloaderConfig


class PolitenessConfig(BaseModel):
    """Config key ``agent.politeness``: limits shared by every agent on ``storage.agents``.

    ``per_domain`` requests at once per domain across all agents (0: no limit but the
    agent's concurrency), ``delay`` seconds at least between two requests to a domain,
    ``robots`` honour robots.txt (disallowed URLs are not fetched: result 2007).
    ``adaptive``: each domain's concurrency climbs to ``per_domain`` (else the agent's
    concurrency) while its server keeps up, and falls with a rising delay (``delay`` its
    floor) when it slows down or answers 429 / 503 (``agents.politeness.adaptive``).
    """

    model_config = ConfigDict(extra="forbid")

    per_domain: int = Field(default=0, ge=0)
    delay: float = Field(default=0.0, ge=0)
    robots: bool = True
    adaptive: bool = False


class AgentSection(BaseModel):
    """Config key ``agent``: the defaults of ``crawlhub agent`` (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    queues: list[str] = Field(default_factory=list)
    concurrency: int = Field(default=64, ge=1)
    lease: float = Field(default=120.0, gt=0)
    downloader: DownloaderConfig = Field(default_factory=DownloaderConfig)
    result_codes: ResultCodes = Field(default_factory=ResultCodes)
    politeness: PolitenessConfig = Field(default_factory=PolitenessConfig)
    #: how tasks that ask for rendering are rendered (``agents.browser.RenderConfig``)
    render: RenderConfig = Field(default_factory=RenderConfig)
    #: a sink mapping as ``jobs[].sink`` takes it (None: items are not written)
    sink: dict[str, Any] | None = None

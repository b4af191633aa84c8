"""The ``agent`` config section: how ``crawlhub agent`` downloads, what its results are
called, how polite it is and where its items go. Command-line options override it.

    agent:
      queues: [pages]             # default: every queue outbound
      concurrency: 64
      lease: 120                  # seconds a leased task stays this agent's
      downloader:                 # DownloaderConfig (below)
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

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from crawlhub.agents.codes import ResultCodes, config_error
from crawlhub.agents.proxies import ProxyConfig
from crawlhub.core.configtypes import new_list
from crawlhub.core.userregex import compile_user_regex

# The downloader's and the browser's models live here, not beside the code that uses
# them: reading a config imports neither aiohttp nor the browser (start-up). Their
# modules import them from here (crawlhub.agents.downloader.DownloaderConfig and
# crawlhub.agents.browser.RenderConfig are these).

#: Name your bot and a page about it in ``agent.downloader.headers.User-Agent``
#: (e.g. ``mybot/1.0 (+https://example.com/bot)``): sites read robots.txt rules for it.
DEFAULT_USER_AGENT = "crawlhub/0.1"


class BanRules(BaseModel):
    """Config key ``downloader.ban``: a response whose status is in ``statuses`` or whose
    body matches ``body_regex`` is banned. Its proxy is retired for ``cooldown`` s (the
    pool's own cooldown when unset), the job's cookies are cleared and the request is tried
    again on another proxy, at most ``retries`` more times."""

    model_config = ConfigDict(extra="forbid")

    statuses: list[int] = []
    body_regex: str | None = None
    retries: int = Field(default=3, ge=0)
    cooldown: float | None = Field(default=None, gt=0)

    @field_validator("statuses")
    @classmethod
    def _statuses(cls, value: list[int]) -> list[int]:
        for status in value:
            if not 100 <= status <= 599:
                raise ValueError(f"{status} is not an HTTP status (100..599)")
        return value

    @field_validator("body_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            compile_user_regex(value.encode())  # ValueError: why RE2 refuses it
        return value


class DownloaderConfig(BaseModel):
    """Config key ``downloader``.

    ``timeout`` s per request hop (``connect_timeout`` for the connection alone);
    ``max_redirects`` hops followed (more is the outcome ``too_many_redirects``);
    ``max_size`` bytes of body at most (more is ``too_large``, the read stops there);
    ``concurrency`` connections in the shared pool (``per_host`` per host, 0 = no limit);
    ``session_idle`` s after which a job's unused session (its cookies) is released;
    ``headers`` sent with every request; ``ban`` the ban rules; ``proxies`` the pool.
    """

    model_config = ConfigDict(extra="forbid")

    timeout: float = Field(default=30.0, gt=0)
    connect_timeout: float | None = Field(default=10.0, gt=0)
    max_redirects: int = Field(default=10, ge=0)
    max_size: int = Field(default=10 * 1024 * 1024, gt=0)
    concurrency: int = Field(default=100, ge=1)
    per_host: int = Field(default=0, ge=0)
    session_idle: float = Field(default=300.0, gt=0)
    headers: dict[str, str] = {"User-Agent": DEFAULT_USER_AGENT}
    ban: BanRules = BanRules()
    proxies: ProxyConfig = ProxyConfig()

    @property
    def user_agent(self) -> str:
        """The User-Agent every request carries (robots.txt is read for it)."""
        return str(self.headers.get("User-Agent") or DEFAULT_USER_AGENT)

    @classmethod
    def from_config(
        cls, data: Mapping[str, Any] | None, *, file: str | None = None, key: str = "downloader"
    ) -> DownloaderConfig:
        """Validate a ``downloader`` mapping; a bad entry is a ``ConfigError`` naming its key
        (e.g. ``downloader.ban.body_regex``)."""
        try:
            return cls.model_validate(dict(data or {}))
        except ValidationError as exc:
            raise config_error(exc, file=file, prefix=key) from None


#: The Chromium the browser downloader drives (Debian's package); ``$CRAWLHUB_CHROMIUM``
#: or ``agent.render.executable`` names another.
CHROMIUM = os.environ.get("CRAWLHUB_CHROMIUM", "/usr/bin/chromium")
WaitUntil = Literal["commit", "domcontentloaded", "load", "networkidle"]
Blockable = Literal["image", "font", "media"]

class RenderWait(BaseModel):
    """How a rendered page is waited for: ``wait_until`` the navigation's event
    (``commit``, ``domcontentloaded``, ``load``, ``networkidle``), then ``wait_for`` a CSS
    selector to be in the DOM (``null``: no selector wait). A task's or a rule set's
    ``render: {wait_for: "#app[data-ready]"}`` takes these keys."""

    model_config = ConfigDict(extra="forbid")

    wait_until: WaitUntil = "load"
    wait_for: str | None = None


class RenderConfig(RenderWait):
    """Config key ``agent.render`` (and ``crawlhub crawl --render``'s options).

    ``concurrency`` pages rendered at once (in one browser context per job); ``timeout`` s
    for a page's navigation and, from its start, for its selector wait; ``block`` the
    kinds of requests the browser drops (``image``, ``font``, ``media``; ``[]`` loads
    everything); a page (and its renderer process, which grows with every navigation) is
    replaced after ``recycle_after`` navigations and the browser after ``restart_after``
    pages; a page whose browser crashed is rendered again at most
    ``crash_retries`` times; ``executable`` the Chromium binary, ``args`` more flags.
    ``wait_until`` / ``wait_for`` are the defaults of pages that name none.
    """

    concurrency: int = Field(default=4, ge=1)
    timeout: float = Field(default=30.0, gt=0)
    block: list[Blockable] = ["image", "font", "media"]
    recycle_after: int = Field(default=10, ge=1)
    restart_after: int = Field(default=2000, ge=1)
    crash_retries: int = Field(default=2, ge=0)
    executable: str = CHROMIUM
    args: list[str] = []

    @classmethod
    def from_config(cls, data: Mapping[str, Any] | None, *, file: str | None = None,
                    key: str = "render") -> RenderConfig:
        """Validate a ``render`` mapping; a bad entry is a ``ConfigError`` naming its key."""
        try:
            return cls.model_validate(dict(data or {}))
        except ValidationError as exc:
            raise config_error(exc, file=file, prefix=key) from None




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

    queues: list[str] = Field(default_factory=new_list)
    concurrency: int = Field(default=64, ge=1)
    lease: float = Field(default=120.0, gt=0)
    downloader: DownloaderConfig = Field(default_factory=DownloaderConfig)
    result_codes: ResultCodes = Field(default_factory=ResultCodes)
    politeness: PolitenessConfig = Field(default_factory=PolitenessConfig)
    #: how tasks that ask for rendering are rendered (:class:`RenderConfig`, below)
    render: RenderConfig = Field(default_factory=RenderConfig)
    #: a sink mapping as ``jobs[].sink`` takes it (None: items are not written)
    sink: dict[str, Any] | None = None
    #: conditional recrawl (``crawlhub agent --revalidate``): the frontier whose archive
    #: keeps each URL's ETag, Last-Modified and body hash; a task leased in a later
    #: segment is asked with If-None-Match / If-Modified-Since, and a 304 (or, unless
    #: ``emit_unchanged``, a body that hashes as before) is not extracted: no item, no
    #: links (None: every page is fetched whole)
    revalidate: str | None = None
    emit_unchanged: bool = False

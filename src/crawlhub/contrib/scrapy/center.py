"""Scrapy's downloads through crawlhub's download center: the spider keeps its parsing
and scheduling, its agents download.

In a Scrapy project's settings (or with ``-s`` on the command line)::

    DOWNLOAD_HANDLERS = {
        "http": "crawlhub.contrib.scrapy.center.CenterDownloadHandler",
        "https": "crawlhub.contrib.scrapy.center.CenterDownloadHandler",
    }
    SPIDER_MIDDLEWARES = {"crawlhub.contrib.scrapy.center.CenterSpiderMiddleware": 50}
    CRAWLHUB_CENTER_URL = "redis://127.0.0.1:6379/0"
    CRAWLHUB_CENTER_STRATEGY = "chained"
    CRAWLHUB_CENTER_AGENTS = 2

====================================  =================================================
``CRAWLHUB_CENTER_URL``               the center's broker (required): ``redis://...``
``CRAWLHUB_CENTER_PREFIX``            its key prefix (default ``crawlhub:``)
``CRAWLHUB_CENTER_STRATEGY``          ``random`` (default), ``fixed`` or ``chained``
``CRAWLHUB_CENTER_AGENTS``            agents to allocate (default 1)
``CRAWLHUB_CENTER_JOB``               the job id (default: the spider's name and a
                                      random suffix)
``CRAWLHUB_CENTER_TIMEOUT``           seconds a download waits for its reply before it
                                      is sent again (default 30)
``CRAWLHUB_CENTER_RETRIES``           sends again after a reply timeout (default 3)
``CRAWLHUB_CENTER_ALLOCATE_TIMEOUT``  seconds the allocation may take (default 10)
``CRAWLHUB_CENTER_KEY``               the key signing the center's messages (default: the
                                      environment's ``CRAWLHUB_CENTER_KEY``; see
                                      docs/center.md)
====================================  =================================================

How a crawl goes:

- **allocation** happens when the spider opens. A refusal (too few live agents) or no
  answer closes the spider (reason ``crawlhub_center_allocation_failed``) with the
  center's answer in the log; nothing is downloaded. The allocation is released when
  Scrapy closes its download handlers.
- **downloads**: each request's method, headers and body travel as they are (Scrapy's
  middlewares already put the user agent, default headers and cookies on it). The agent
  follows redirects itself and decodes the body, so the response's URL is the final one
  and carries no ``Content-Encoding``. ``response.meta["crawlhub_agent"]`` names the
  agent that downloaded it.
- **chained**: :class:`CenterSpiderMiddleware` binds every request a callback yields to
  the agent of the response it came from (``meta["crawlhub_agent"]``); the handler sends
  it to that agent. A request bound to a dead agent is answered ``skipped``: the handler
  drops the binding and raises a retryable error, so Scrapy's retry sends it to any
  allocated agent.
- **retryable errors** (:class:`CenterDownloadError`, a Twisted ``ConnectError`` that
  ``RetryMiddleware`` retries): ``skipped`` and ``failed`` replies and downloads that got
  no response (timeouts, connection errors), with the agent's error in the message.
- **fatal**: a download the center left unanswered past its retries, or a broker down
  past its retries (:class:`~crawlhub.center.messages.CenterError`) fails the request
  and closes the spider (reason ``crawlhub_center_error``).

Both Twisted reactors work (the asyncio one and the others), and so does Scrapy without a
reactor. When an asyncio loop runs the engine (the asyncio reactor, Scrapy's default, or
no reactor) the center's client runs on that loop: no thread hop per request. Under
another reactor it runs on an event loop thread of its own
(:class:`~crawlhub.contrib.scrapy.loop.LoopThread`) and the engine awaits a ``Deferred``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy import Request as ScrapyRequest
from scrapy import signals
from scrapy.exceptions import CloseSpider
from scrapy.http import Headers
from scrapy.responsetypes import responsetypes
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectError

from crawlhub.agents.codes import TOO_LARGE
from crawlhub.center.bus import Bus, open_bus
from crawlhub.center.client import CenterClient
from crawlhub.center.messages import FAILED, SKIPPED, STRATEGIES, CenterError, Reply, check_id
from crawlhub.contrib.scrapy.loop import LoopThread, engine_wait
from crawlhub.contrib.scrapy.settings import _error, _float, _int
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.core.redact import redact_url
from crawlhub.core.signing import load_key, signer_for
from crawlhub.fetch.http import Request

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

log = logging.getLogger("crawlhub.contrib.scrapy.center")

T = TypeVar("T")

#: The meta key naming the agent a response came from and a request is bound to.
AGENT = "crawlhub_agent"
#: Close reasons.
ALLOCATION_FAILED = "crawlhub_center_allocation_failed"
CENTER_ERROR = "crawlhub_center_error"

#: Request headers left to the agent: its downloader decodes the bodies it asks for.
_REQUEST_SKIP = frozenset(("accept-encoding",))
#: Reply headers that no longer describe the body (decoded, joined by the agent).
_RESPONSE_SKIP = frozenset(("content-encoding", "content-length", "transfer-encoding"))
_JOB_CHARS = re.compile(r"[^A-Za-z0-9_.:@-]+")


class CenterDownloadError(ConnectError):
    """The center could not download a request: answered ``skipped`` (chained to a dead
    agent) or ``failed`` (no live agent), or its agent got no response (timeout,
    connection error). A ``ConnectError``, so ``RetryMiddleware`` retries it."""

    def __init__(self, message: str) -> None:
        super().__init__(string=message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class CenterResponseError(Exception):
    """The agent dropped the response (larger than its ``max_size``): not retried."""


@dataclass(slots=True, frozen=True)
class CenterSettings:
    url: str
    prefix: str
    strategy: str
    agents: int
    job: str | None
    timeout: float
    retries: int
    allocate_timeout: float
    #: the message signing key (crawlhub.core.signing); never shown
    key: str | None = field(default=None, repr=False)


def _seconds(settings: BaseSettings, name: str, default: float) -> float:
    value = _float(settings, name, default)
    if value <= 0:
        raise _error(name, f"{value:g} s: give a number of seconds above 0")
    return value


def read_center_settings(settings: BaseSettings) -> CenterSettings:
    """The ``CRAWLHUB_CENTER_*`` settings, checked (``ConfigError`` naming the setting)."""
    url = settings.get("CRAWLHUB_CENTER_URL")
    if not url:
        raise _error("CRAWLHUB_CENTER_URL", "not set: give the download center's broker,"
                     " e.g. redis://127.0.0.1:6379/0")
    strategy = str(settings.get("CRAWLHUB_CENTER_STRATEGY") or "random")
    if strategy not in STRATEGIES:
        raise _error("CRAWLHUB_CENTER_STRATEGY", f"{strategy!r}: use one of"
                     f" {', '.join(STRATEGIES)}")
    agents = _int(settings, "CRAWLHUB_CENTER_AGENTS", 1, 0 if strategy == "random" else 1)
    job = settings.get("CRAWLHUB_CENTER_JOB") or None
    if job is not None:
        try:
            check_id(job, "job id")
        except ValueError as exc:
            raise _error("CRAWLHUB_CENTER_JOB", str(exc)) from None
    return CenterSettings(
        url=str(url),
        prefix=str(settings.get("CRAWLHUB_CENTER_PREFIX") or DEFAULT_PREFIX),
        strategy=strategy,
        agents=agents,
        job=job,
        timeout=_seconds(settings, "CRAWLHUB_CENTER_TIMEOUT", 30.0),
        retries=_int(settings, "CRAWLHUB_CENTER_RETRIES", 3, 0),
        allocate_timeout=_seconds(settings, "CRAWLHUB_CENTER_ALLOCATE_TIMEOUT", 10.0),
        key=settings.get("CRAWLHUB_CENTER_KEY") or None,
    )


def default_job(spider_name: str) -> str:
    """The spider's name (characters a job id cannot hold replaced) and a random suffix."""
    name = _JOB_CHARS.sub("-", spider_name or "spider")[:180]
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _request_headers(headers: Headers) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw_name, values in headers.items():
        name = raw_name.decode("latin-1") if isinstance(raw_name, bytes) else str(raw_name)
        if name.lower() in _REQUEST_SKIP or not values:
            continue
        sep = "; " if name.lower() == "cookie" else ", "
        out[name] = sep.join(v.decode("latin-1") if isinstance(v, bytes) else str(v)
                             for v in values)
    return out


def _bound_agent(request: ScrapyRequest) -> str | None:
    agent = request.meta.get(AGENT)
    return str(agent) if agent else None


class CenterDownloadHandler:
    """Scrapy download handler sending every request through the download center.

    One instance serves a crawler's schemes (``http`` and ``https`` map to the same
    object, so a spider makes one allocation)."""

    lazy = False

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.settings = read_center_settings(crawler.settings)
        self.job: str | None = None
        self.client: CenterClient | None = None
        self._bus: Bus | None = None
        self._loop: LoopThread | None = None
        self._opening: Future[CenterClient] | None = None
        self._failed: Exception | None = None
        self._close_reason: str | None = None
        self._closed = False
        #: the client runs on the engine's asyncio loop (no loop thread)
        self._native = False
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CenterDownloadHandler:
        handler = _HANDLERS.get(crawler)
        if handler is None:
            handler = cls(crawler) if _ASYNC_HANDLERS else _DeferredHandler(crawler)
            _HANDLERS[crawler] = handler
        return handler

    # ------------------------------------------------------------------ allocation
    async def _spider_opened(self, spider: Spider) -> None:
        if self._loop is not None or self._native:
            return
        s = self.settings
        self.job = job = s.job or default_job(spider.name)
        try:
            asyncio.get_running_loop()
            # the asyncio reactor (or no reactor): the client runs on Scrapy's own loop,
            # no thread hop and no GIL ping-pong per request
            self._native = True
        except RuntimeError:
            self._loop = LoopThread(f"crawlhub-center-{job}")
            self._opening = self._loop.submit(self._open(job))
        try:
            if self._native:
                self.client = await self._open(job)
            else:
                assert self._opening is not None
                self.client = await engine_wait(self._opening)
        except Exception as exc:  # noqa: BLE001 - refused, unanswered, broker down, bad URL
            self._failed = exc
            why = str(exc) if isinstance(exc, CenterError) else (
                f"job {job}: {type(exc).__name__}: {exc}")
            log.error("crawlhub download center %s: %s; closing the spider",
                      redact_url(s.url), why)
            raise CloseSpider(ALLOCATION_FAILED) from exc
        log.info("crawlhub download center %s: job %s allocated %s (%s)", redact_url(s.url),
                 job, ", ".join(self.client.agents) or "no agent", s.strategy)
        stats = self.crawler.stats
        if stats is not None:
            stats.set_value("crawlhub_center/job", job)
            stats.set_value("crawlhub_center/agents", len(self.client.agents))

    async def _open(self, job: str) -> CenterClient:
        """On the loop thread: the bus, the client, the allocation."""
        s = self.settings
        bus = open_bus(s.url, prefix=s.prefix,
                       signer=signer_for(load_key(s.key, None)))
        try:
            client = CenterClient(bus, job, strategy=s.strategy, agents=s.agents,
                                  allocate_timeout=s.allocate_timeout, timeout=s.timeout,
                                  retries=s.retries)
            await client.open()
        except BaseException:
            await bus.close()
            raise
        self._bus = bus
        return client

    # ------------------------------------------------------------------ downloads
    async def download_request(self, request: ScrapyRequest,
                               spider: Spider | None = None) -> Response:
        client, loop = self.client, self._loop
        if client is None or (loop is None and not self._native):
            # only when the spider went on without its allocation (a Scrapy that does
            # not close a spider whose spider_opened handler raised CloseSpider)
            self._close_spider(ALLOCATION_FAILED)
            raise self._failed or CenterError("the download center allocated no agent:"
                                              " the spider did not open")
        req = Request(request.url, method=request.method,
                      headers=_request_headers(request.headers), data=request.body or None)
        try:
            if loop is None:
                reply = await client.fetch(req, agent=_bound_agent(request))
            else:
                reply = await engine_wait(loop.submit(client.fetch(req,
                                                             agent=_bound_agent(request))))
        except CenterError as exc:
            log.error("crawlhub download center: %s; closing the spider", exc)
            self._close_spider(CENTER_ERROR)
            raise
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value(f"crawlhub_center/reply/{reply.status}")
        return self._response(request, reply)

    def _response(self, request: ScrapyRequest, reply: Reply) -> Response:
        if reply.status in (SKIPPED, FAILED):
            if reply.status == SKIPPED:
                request.meta.pop(AGENT, None)  # its agent is dead: the retry goes anywhere
            raise CenterDownloadError(f"download center answered {reply.status} for"
                                      f" {request.url}: {reply.error or 'no reason given'}")
        if not reply.http_status:
            raise CenterDownloadError(f"agent {reply.agent} got no response from"
                                      f" {request.url} ({reply.outcome or 'no outcome'}):"
                                      f" {reply.error or 'no error given'}")
        if reply.outcome == TOO_LARGE:
            raise CenterResponseError(f"agent {reply.agent} dropped the response of"
                                      f" {request.url}: {reply.error}")
        request.meta[AGENT] = reply.agent  # response.meta is request.meta
        request.meta["download_latency"] = reply.elapsed  # what AutoThrottle reads
        headers = Headers({k: v for k, v in reply.headers.items()
                           if k.lower() not in _RESPONSE_SKIP})
        url = reply.url or request.url
        cls = responsetypes.from_args(headers=headers, url=url, body=reply.body)
        return cls(url=url, status=reply.http_status, headers=headers, body=reply.body,
                   request=request)

    def _close_spider(self, reason: str) -> None:
        """Ask the engine to close the spider (once; on the engine's thread)."""
        if self._close_reason is not None:
            return
        try:
            engine = self.crawler.engine
        except Exception:  # noqa: BLE001 - no engine (yet)
            return
        spider = self.crawler.spider
        if engine is None or spider is None or getattr(engine, "spider", spider) is None:
            return
        self._close_reason = reason
        close_async = getattr(engine, "close_spider_async", None)
        if close_async is not None:
            d = deferred_from_coro(close_async(reason=reason))
        else:  # Scrapy < 2.14
            d = engine.close_spider(spider, reason)
        d.addErrback(lambda failure: log.error("closing the spider failed: %s",
                                               failure.getErrorMessage()))

    # ------------------------------------------------------------------ shutdown
    async def close(self) -> None:
        """Release the allocation and stop the loop thread (Scrapy calls this once it
        stopped the engine)."""
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        if loop is None:
            if self._native:
                try:
                    await self._shutdown()
                except Exception as exc:  # noqa: BLE001 - shutting down either way
                    log.warning("crawlhub download center: releasing job %s failed: %s",
                                self.job, exc)
            return
        if self._opening is not None:
            self._opening.cancel()  # still allocating: give up
        try:
            await engine_wait(loop.submit(self._shutdown()))
        except Exception as exc:  # noqa: BLE001 - shutting down either way
            log.warning("crawlhub download center: releasing job %s failed: %s", self.job,
                        exc)
        finally:
            loop.stop()

    async def _shutdown(self) -> None:
        """On the loop thread: release the allocation, close the bus."""
        client, bus = self.client, self._bus
        try:
            if client is not None:
                await asyncio.wait_for(client.close(), 15.0)
                log.info("crawlhub download center: job %s released (%s)", self.job,
                         ", ".join(f"{k} {v}" for k, v in client.stats().items()
                                   if k in ("sent", "returned", "retried", "skipped",
                                            "failed", "duplicates")))
        finally:
            if bus is not None:
                await bus.close()


class _DeferredHandler(CenterDownloadHandler):
    """Scrapy < 2.14 calls ``download_request(request, spider)`` for a Deferred and
    ``close()`` for a Deferred or None."""

    def download_request(self, request: ScrapyRequest,  # type: ignore[override]
                         spider: Spider | None = None) -> Deferred[Response]:
        return deferred_from_coro(super().download_request(request, spider))

    def close(self) -> Deferred[None]:  # type: ignore[override]
        return deferred_from_coro(super().close())


def _async_handlers() -> bool:
    from scrapy.core.downloader.handlers import DownloadHandlers

    return hasattr(DownloadHandlers, "download_request_async")


_ASYNC_HANDLERS = _async_handlers()
_HANDLERS: weakref.WeakKeyDictionary[Crawler, CenterDownloadHandler] = (
    weakref.WeakKeyDictionary())


class CenterSpiderMiddleware:
    """Binds every request a callback yields to the agent its response came from
    (``meta["crawlhub_agent"]``, unless the request names one already): with the
    ``chained`` strategy the center sends it to that agent. Other strategies ignore it."""

    def process_spider_output(self, response: Response, result: Iterable[Any],
                              spider: Spider | None = None) -> Iterator[Any]:
        agent = _response_agent(response)
        for obj in result:
            yield _bind(obj, agent)

    async def process_spider_output_async(self, response: Response,
                                          result: AsyncIterator[Any],
                                          spider: Spider | None = None
                                          ) -> AsyncIterator[Any]:
        agent = _response_agent(response)
        async for obj in result:
            yield _bind(obj, agent)


def _response_agent(response: Response) -> str | None:
    try:
        agent = response.meta.get(AGENT)
    except AttributeError:  # a response with no request
        return None
    return str(agent) if agent else None


def _bind(obj: Any, agent: str | None) -> Any:
    if agent and isinstance(obj, ScrapyRequest) and not obj.meta.get(AGENT):
        obj.meta[AGENT] = agent
    return obj


__all__ = [
    "AGENT",
    "CenterDownloadError",
    "CenterDownloadHandler",
    "CenterResponseError",
    "CenterSettings",
    "CenterSpiderMiddleware",
    "read_center_settings",
]

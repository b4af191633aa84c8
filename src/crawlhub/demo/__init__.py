"""``crawlhub demo``: a local demo site and paged JSON API, so every example runs offline.

One aiohttp application on a loopback address: a small shop to crawl (``site.py``) and a
news / orders API for collection jobs (``api.py``), with optional latency and errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from crawlhub.core.errors import CrawlhubError
from crawlhub.core.hosts import is_loopback

DEFAULT_PORT = 8600

#: Answered normally even under error injection: a crawler's politeness check and a probe.
_NEVER_FAILS = frozenset({"/robots.txt", "/healthz"})


class DemoError(CrawlhubError):
    """A bad ``crawlhub demo`` option (a host that is not loopback, a bad latency)."""


@dataclass
class DemoConfig:
    """What the demo serves and how it misbehaves. ``clock`` and ``sleep`` are injectable
    so tests can move time (the news total grows with it) without waiting."""

    #: News items the API holds at start, dated over the last ``history_days``.
    items: int = 1000
    history_days: float = 30.0
    #: A new news item is published every this many seconds (0: the total never grows).
    grow_every: float = 2.0
    #: Seconds added to every answer: a uniform draw in ``[min, max]``.
    latency: tuple[float, float] = (0.0, 0.0)
    #: Share of answers replaced by a 500 or a 429 (with Retry-After), 0..1.
    error_rate: float = 0.0
    #: Seed of the latency and error draws: the same seed gives the same sequence.
    seed: int = 0
    #: Pages of the JavaScript shop under ``/js/`` (rendered in a browser to be crawled).
    js_pages: int = 1000
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)

    def __post_init__(self) -> None:
        low, high = self.latency
        if low < 0 or high < low:
            raise DemoError(f"latency {low}-{high}: give seconds >= 0, min <= max")
        if not 0.0 <= self.error_rate <= 1.0:
            raise DemoError(f"error rate {self.error_rate}: give a share between 0 and 1")
        if self.js_pages < 1:
            raise DemoError(f"js pages {self.js_pages}: give 1 or more")
        if self.items < 0 or self.history_days <= 0 or self.grow_every < 0:
            raise DemoError("items >= 0, history_days > 0 and grow_every >= 0 are required")


def parse_latency(text: str) -> tuple[float, float]:
    """``"0.05"`` -> (0.05, 0.05); ``"0.01-0.2"`` or ``"0.01,0.2"`` -> (0.01, 0.2)."""
    parts = text.replace(",", "-").split("-") if text.strip() else []
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2):
        raise DemoError(f"latency {text!r}: give seconds (0.05) or a range (0.01-0.2)")
    low, high = values[0], values[-1]
    if low < 0 or high < low:
        raise DemoError(f"latency {text!r}: seconds must be >= 0 and min <= max")
    return low, high


def create_app(config: DemoConfig | None = None) -> web.Application:
    """The demo application: site pages, the JSON API, latency and error injection."""
    from crawlhub.demo import api, site

    config = config or DemoConfig()
    rng = random.Random(config.seed)

    @web.middleware
    async def misbehave(request: web.Request, handler: Callable[[web.Request],
                                                                Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
        low, high = config.latency
        if high > 0:
            await config.sleep(rng.uniform(low, high))
        if config.error_rate and request.path not in _NEVER_FAILS \
                and rng.random() < config.error_rate:
            return _injected_error(request, 429 if rng.random() < 0.5 else 500)
        return await handler(request)

    app = web.Application(middlewares=[misbehave])
    app.router.add_get("/healthz", _healthz)
    site.add_routes(app, js_pages=config.js_pages)
    api.add_routes(app, api.NewsFeed.start(config), clock=config.clock)
    return app


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def _injected_error(request: web.Request, status: int) -> web.Response:
    headers = {"Retry-After": "1"} if status == 429 else {}
    msg = "too many requests (injected)" if status == 429 else "server error (injected)"
    if request.path.startswith("/api/"):
        return web.json_response({"code": status, "msg": msg}, status=status, headers=headers)
    return web.Response(text=msg, status=status, headers=headers)


def run_demo(config: DemoConfig, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
             *, ready: Callable[[str], None] | None = None) -> None:
    """Serve the demo on ``host:port`` until Ctrl-C / SIGTERM; loopback hosts only.
    ``ready(url)`` is called once the port is bound."""
    if not is_loopback(host):
        raise DemoError(
            f"host {host!r} is not a loopback address: the demo binds only to 127.0.0.1, ::1 "
            "or localhost, so it is never reachable from another machine"
        )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(create_app(config), host, port, ready))


async def _serve(app: web.Application, host: str, port: int,
                 ready: Callable[[str], None] | None) -> None:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            raise DemoError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                            "pick another port with --port") from None
        if ready is not None:
            ready(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()

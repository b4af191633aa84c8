"""Demo fixtures: the demo app served on 127.0.0.1 in the test's loop, with a clock the
test moves by hand (the news total grows with it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from crawlhub.demo import DemoConfig, create_app
from tests.helpers import FakeClock
from tests.servers import free_port

START = 1_790_000_000.0  # a fixed "now" for the demo: its content depends only on this


@dataclass
class Demo:
    url: str
    session: aiohttp.ClientSession
    clock: FakeClock

    async def get(self, path: str, **kw: Any) -> tuple[int, Any, Any]:
        """``(status, body, headers)``; the body is JSON for /api/, else text."""
        async with self.session.get(self.url + path, allow_redirects=False, **kw) as resp:
            body: Any = (await resp.json(content_type=None) if path.startswith("/api/")
                         else await resp.text())
            return resp.status, body, resp.headers

    async def post(self, path: str, payload: Any) -> tuple[int, Any]:
        async with self.session.post(self.url + path, json=payload) as resp:
            return resp.status, await resp.json(content_type=None)


@asynccontextmanager
async def serve_demo(**options: Any) -> AsyncIterator[Demo]:
    """Serve ``create_app(DemoConfig(**options))`` on a free loopback port."""
    clock = options.pop("clock", None) or FakeClock(START)
    app = create_app(DemoConfig(clock=clock, **options))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Demo(f"http://127.0.0.1:{port}", session, clock)
    finally:
        await runner.cleanup()


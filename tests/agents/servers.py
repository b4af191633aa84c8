"""Local HTTP servers for agent tests, on 127.0.0.1 (aiohttp.web, started in the test's loop).

``Site``: a link graph (``/page/{n}``), any status (``/status/{code}``), 429/503 with
``Retry-After`` (``/retry-after/{s}``), redirects and a redirect loop, huge bodies (with a
length, chunked, gzip), a slow page, a page held until the test lets it go, cookies, a
non-UTF-8 page, a proxy list for a provider, per-path request counts and the peak number
of requests in flight. ``ForwardProxy``: a plain-HTTP forward proxy that can be told to
answer "banned" by status or by body text. Use either as ``async with Site() as site``.
"""

from __future__ import annotations

import asyncio
import gzip
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE",
        "Trailer", "Transfer-Encoding", "Upgrade", "Proxy-Connection", "Host",
        "Content-Length",
    )
)


class _Server:
    """Start ``self.app`` on a free port of 127.0.0.1; ``url`` is its root (no slash)."""

    def __init__(self) -> None:
        self.app = web.Application()
        self.url = ""
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def page_html(n: int, pages: int, links: int = 10) -> str:
    """Page ``n`` of a ``pages``-page site: a title and ``links`` links; following them
    from page 0 reaches every page."""
    targets = [(n * links + k + 1) % pages for k in range(links)]
    items = "".join(f'<li><a href="/page/{t}">Page {t}</a></li>' for t in targets)
    return (
        f"<!DOCTYPE html><html><head><title>Page {n}</title></head>"
        f"<body><h1>Page {n}</h1><ul>{items}</ul>"
        f"<p>{'lorem ipsum dolor sit amet ' * 40}</p></body></html>"
    )


class Site(_Server):
    """The test site. ``hits`` counts requests per path; ``in_flight`` / ``peak`` count
    concurrent requests; ``release`` lets requests held at ``/held`` finish."""

    def __init__(self, pages: int = 100, huge_size: int = 50 * 1024 * 1024) -> None:
        super().__init__()
        self.pages = pages
        self.huge_size = huge_size
        self.hits: Counter[str] = Counter()
        self.in_flight = 0
        self.peak = 0
        self.streamed = 0  # bytes /huge-stream wrote before the client went away
        self.stream_done = asyncio.Event()
        self.held = 0
        self.release = asyncio.Event()
        self.proxy_list = ""
        self.proxy_list_status = 200
        r = self.app.router
        r.add_get("/page/{n}", self.page)
        r.add_get("/status/{code}", self.status)
        r.add_get("/retry-after/{seconds}", self.retry_after)
        r.add_get("/redirect/{n}", self.redirect)
        r.add_get("/loop", self.loop)
        r.add_post("/post-redirect", self.post_redirect)
        r.add_route("*", "/echo", self.echo)
        r.add_get("/huge-length", self.huge_length)
        r.add_get("/huge-stream", self.huge_stream)
        r.add_get("/gzip-bomb", self.gzip_bomb)
        r.add_get("/slow", self.slow)
        r.add_get("/held", self.held_page)
        r.add_get("/set-cookie", self.set_cookie)
        r.add_get("/cookies", self.cookies)
        r.add_get("/guarded", self.guarded)
        r.add_get("/login", self.login)
        r.add_route("*", "/to", self.to)
        r.add_get("/latin1", self.latin1)
        r.add_get("/proxies.txt", self.proxies)
        self.app.middlewares.append(self._count)

    @web.middleware
    async def _count(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.hits[request.path] += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await handler(request)  # type: ignore[no-any-return]
        finally:
            self.in_flight -= 1

    async def page(self, request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if not 0 <= n < self.pages:
            raise web.HTTPNotFound()
        return web.Response(text=page_html(n, self.pages), content_type="text/html")

    async def status(self, request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]), text="status page")

    async def retry_after(self, request: web.Request) -> web.Response:
        """429 with ``Retry-After: {seconds}`` (``?status=503`` for a 503)."""
        status = int(request.query.get("status", "429"))
        return web.Response(status=status, text="slow down",
                            headers={"Retry-After": request.match_info["seconds"]})

    async def redirect(self, request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        target = "/page/0" if n <= 0 else f"/redirect/{n - 1}"
        raise web.HTTPFound(target)

    async def loop(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def post_redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPSeeOther("/echo")

    async def echo(self, request: web.Request) -> web.Response:
        return web.json_response({
            "method": request.method,
            "query": dict(request.query),
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": (await request.read()).decode("utf-8", "replace"),
        })

    async def huge_length(self, request: web.Request) -> web.Response:
        return web.Response(body=b"x" * self.huge_size)

    async def huge_stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        chunk = b"y" * 65536
        try:
            while self.streamed < self.huge_size:
                await resp.write(chunk)
                self.streamed += len(chunk)
        except (ConnectionError, asyncio.CancelledError):
            self.stream_done.set()
            raise
        self.stream_done.set()
        return resp

    async def gzip_bomb(self, request: web.Request) -> web.Response:
        body = gzip.compress(b"\0" * self.huge_size, compresslevel=9)
        return web.Response(body=body, headers={"Content-Encoding": "gzip"})

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(60)
        return web.Response(text="finally")

    async def held_page(self, request: web.Request) -> web.Response:
        self.held += 1
        await self.release.wait()
        return web.Response(text="released")

    async def set_cookie(self, request: web.Request) -> web.Response:
        resp = web.Response(text="set")
        for name, value in request.query.items():
            resp.set_cookie(name, value)
        return resp

    async def cookies(self, request: web.Request) -> web.Response:
        return web.json_response(dict(request.cookies))

    async def login(self, request: web.Request) -> web.Response:
        """Set ``sid=logged`` and redirect to ``/cookies`` in the same answer."""
        resp = web.Response(status=302, headers={"Location": "/cookies"})
        resp.set_cookie("sid", "logged")
        return resp

    async def to(self, request: web.Request) -> web.Response:
        """Redirect to ``?url=`` with ``?status=`` (302 by default)."""
        status = int(request.query.get("status", "302"))
        return web.Response(status=status, headers={"Location": request.query["url"]})

    async def guarded(self, request: web.Request) -> web.Response:
        """403 for a client that carries a ``sid`` cookie: the site knows that session."""
        if "sid" in request.cookies:
            return web.Response(status=403, text="we know you")
        return web.Response(text="welcome, stranger")

    async def latin1(self, request: web.Request) -> web.Response:
        body = "<html><head><title>Caf\u00e9 cr\u00e8me</title></head><body>\u00e9t\u00e9</body></html>"
        charset = request.query.get("charset")
        ctype = "text/html" + (f"; charset={charset}" if charset else "")
        return web.Response(body=body.encode("latin-1"), headers={"Content-Type": ctype})

    async def proxies(self, request: web.Request) -> web.Response:
        return web.Response(text=self.proxy_list, status=self.proxy_list_status)


class ForwardProxy(_Server):
    """A plain-HTTP forward proxy. ``ban_status`` (e.g. 403) or ``ban_body`` (text served
    with 200) make it answer "banned" instead of forwarding; ``seen`` lists the URLs it
    was asked for."""

    def __init__(self, ban_status: int | None = None, ban_body: str | None = None) -> None:
        super().__init__()
        self.ban_status = ban_status
        self.ban_body = ban_body
        self.seen: list[str] = []
        self._client: aiohttp.ClientSession | None = None
        self.app.router.add_route("*", "/{tail:.*}", self.forward)

    async def start(self) -> None:
        self._client = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False
        )
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._client is not None:
            await self._client.close()

    async def forward(self, request: web.Request) -> web.Response:
        target = str(request.url)
        self.seen.append(target)
        if self.ban_status is not None:
            return web.Response(status=self.ban_status, text="banned by proxy test")
        if self.ban_body is not None:
            return web.Response(text=self.ban_body, content_type="text/html")
        assert self._client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._client.request(
            request.method, target, headers=headers, data=await request.read(),
            allow_redirects=False,
        ) as upstream:
            body = await upstream.read()
            resp = web.Response(status=upstream.status, body=body)
            for name, value in upstream.headers.items():
                low = name.lower()
                if low == "set-cookie":
                    resp.headers.add(name, value)
                elif low not in HOP_BY_HOP:
                    resp.headers[name] = value
            return resp

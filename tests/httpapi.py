"""A real paged JSON API on 127.0.0.1 for tests: pages, details, injected faults, a request log.

Start it in the test's event loop (``async with ApiServer(...) as api``) or in a thread of
its own (``with ApiServer(...).in_thread() as api``) for synchronous callers such as the CLI.

Endpoints (every JSON body carries ``code`` (0 = ok) and ``msg``):

- ``GET /items?offset=&limit=`` or ``GET /items?page=&size=`` (page is 1-based): a page of
  items in ascending id order (oldest first, newest last, like the seed's source) with
  ``total``; ``GET /items/count`` answers ``{"total": N}`` only.
- ``GET /items/{id}``: one item under ``item`` (404 with ``code: 404`` when unknown).
- ``GET /echo``: answers the query back (any path works for faults).

Faults are scheduled with :meth:`ApiServer.inject`: an HTTP status, a delay (a slow or
hanging response), or an API error code in a 200 JSON body such as
``{"code": 500, "msg": "busy"}``; each fault applies to the next ``times`` requests that
match (a path prefix, the n-th request, or a predicate), in the order they were injected.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web

from tests.servers import free_port

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def make_items(
    count: int,
    *,
    start_id: int = 1,
    newest: datetime | None = None,
    step: timedelta = timedelta(hours=1),
) -> list[dict[str, Any]]:
    """``count`` items with ascending ids and dates; the last one is dated ``newest``."""
    newest = newest or datetime.now().replace(microsecond=0)
    items = []
    for n in range(count):
        when = newest - step * (count - 1 - n)
        items.append(
            {"id": start_id + n, "name": f"item-{start_id + n}", "date": when.strftime(DATE_FORMAT)}
        )
    return items


@dataclass
class Fault:
    """What a matched request gets instead of its normal answer."""

    status: int | None = None  # answer with this HTTP status
    delay: float = 0.0  # wait this long before answering (use a large value to hang)
    api_code: int | None = None  # answer 200 with this ``code`` in the JSON body
    msg: str = "injected fault"

    @classmethod
    def http(cls, status: int = 503, msg: str = "unavailable") -> Fault:
        return cls(status=status, msg=msg)

    @classmethod
    def slow(cls, seconds: float) -> Fault:
        return cls(delay=seconds)

    @classmethod
    def api_error(cls, code: int = 500, msg: str = "busy") -> Fault:
        return cls(api_code=code, msg=msg)


@dataclass
class _Rule:
    fault: Fault
    times: int | None  # None = forever
    path: str | None
    nth: int | None
    when: Callable[[web.Request], bool] | None

    def matches(self, request: web.Request, index: int) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.path is not None and not request.path.startswith(self.path):
            return False
        if self.nth is not None and index != self.nth:
            return False
        return self.when is None or self.when(request)


@dataclass
class LoggedRequest:
    """One request the server received, in arrival order (``index`` counts from 0)."""

    index: int
    method: str
    path: str
    query: dict[str, str]
    received_at: float
    status: int | None = None
    fault: Fault | None = None
    finished_at: float | None = None
    abandoned: bool = False  # the client went away before the answer was sent

    @property
    def path_qs(self) -> str:
        if not self.query:
            return self.path
        return self.path + "?" + "&".join(f"{k}={v}" for k, v in self.query.items())


@dataclass
class ApiServer:
    """The paged JSON API; ``items`` may be changed between runs (``add_items``)."""

    items: list[dict[str, Any]] = field(default_factory=lambda: make_items(25))
    host: str = "127.0.0.1"
    port: int = 0
    log: list[LoggedRequest] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrivals: list[tuple[int, asyncio.Future[None]]] = []

    # ---- lifecycle -------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> ApiServer:
        app = web.Application()
        app.router.add_get("/items", self._list)
        app.router.add_get("/items/count", self._count)
        app.router.add_get("/items/{id}", self._detail)
        app.router.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        self.port = self.port or free_port()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self._loop = asyncio.get_running_loop()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ApiServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextmanager
    def in_thread(self) -> Iterator[ApiServer]:
        """Serve from a thread with its own event loop (for synchronous test code)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="httpapi", daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(self.start(), loop).result(10)
        try:
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()

    # ---- test controls ----------------------------------------------------------------
    def inject(
        self,
        fault: Fault,
        *,
        times: int | None = 1,
        path: str | None = None,
        nth: int | None = None,
        when: Callable[[web.Request], bool] | None = None,
    ) -> None:
        """Answer the next ``times`` matching requests (None = all) with ``fault``."""
        with self._lock:
            self._rules.append(_Rule(fault, times, path, nth, when))

    def clear_faults(self) -> None:
        with self._lock:
            self._rules.clear()

    def add_items(self, count: int, *, newest: datetime | None = None) -> list[dict[str, Any]]:
        """Append ``count`` newer items (the source grew between two runs)."""
        start = (max(int(i["id"]) for i in self.items) + 1) if self.items else 1
        new = make_items(count, start_id=start, newest=newest)
        self.items.extend(new)
        return new

    @property
    def paths(self) -> list[str]:
        return [r.path_qs for r in self.log]

    def requests_to(self, prefix: str) -> list[LoggedRequest]:
        return [r for r in self.log if r.path.startswith(prefix)]

    async def wait_for_requests(self, count: int, timeout: float = 10.0) -> None:
        """Wait until the server has received ``count`` requests (no polling sleeps)."""
        if len(self.log) >= count:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._arrivals.append((count, fut))
        await asyncio.wait_for(fut, timeout)

    # ---- handlers ---------------------------------------------------------------------
    def _arrive(self, request: web.Request) -> tuple[LoggedRequest, Fault | None]:
        with self._lock:
            entry = LoggedRequest(
                index=len(self.log),
                method=request.method,
                path=request.path,
                query=dict(request.query),
                received_at=time.monotonic(),
            )
            self.log.append(entry)
            fault = None
            for rule in self._rules:
                if rule.matches(request, entry.index):
                    if rule.times is not None:
                        rule.times -= 1
                    fault = rule.fault
                    break
            entry.fault = fault
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            waiting = [(n, f) for n, f in self._arrivals if len(self.log) >= n]
            self._arrivals = [(n, f) for n, f in self._arrivals if len(self.log) < n]
        for _, fut in waiting:
            fut.get_loop().call_soon_threadsafe(_resolve, fut)
        return entry, fault

    async def _answer(
        self,
        request: web.Request,
        make_body: Callable[[], tuple[int, dict[str, Any]]],
    ) -> web.Response:
        entry, fault = self._arrive(request)
        try:
            if fault is not None and fault.delay:
                await asyncio.sleep(fault.delay)
            if fault is not None and fault.status is not None:
                status, body = fault.status, {"code": fault.status, "msg": fault.msg}
            elif fault is not None and fault.api_code is not None:
                status, body = 200, {"code": fault.api_code, "msg": fault.msg}
            else:
                status, body = make_body()
            entry.status = status
            return web.json_response(body, status=status)
        except asyncio.CancelledError:
            entry.abandoned = True
            raise
        finally:
            entry.finished_at = time.monotonic()
            with self._lock:
                self.in_flight -= 1

    async def _list(self, request: web.Request) -> web.Response:
        def body() -> tuple[int, dict[str, Any]]:
            query = request.query
            try:
                if "page" in query or "size" in query:
                    size = int(query.get("size", "10"))
                    page = int(query.get("page", "1"))
                    offset, limit = (page - 1) * size, size
                else:
                    offset = int(query.get("offset", "0"))
                    limit = int(query.get("limit", "10"))
            except ValueError:
                return 400, {"code": 400, "msg": "offset/limit/page/size must be integers"}
            if offset < 0 or limit < 0:
                return 400, {"code": 400, "msg": "offset and limit must be >= 0"}
            page_items = self.items[offset : offset + limit]
            return 200, {
                "code": 0,
                "msg": "ok",
                "total": len(self.items),
                "offset": offset,
                "limit": limit,
                "items": page_items,
            }

        return await self._answer(request, body)

    async def _count(self, request: web.Request) -> web.Response:
        return await self._answer(request, lambda: (200, {"code": 0, "total": len(self.items)}))

    async def _detail(self, request: web.Request) -> web.Response:
        def body() -> tuple[int, dict[str, Any]]:
            wanted = request.match_info["id"]
            for item in self.items:
                if str(item["id"]) == wanted:
                    return 200, {"code": 0, "msg": "ok", "item": {**item, "detail": True}}
            return 404, {"code": 404, "msg": f"no item {wanted}"}

        return await self._answer(request, body)

    async def _echo(self, request: web.Request) -> web.Response:
        return await self._answer(request, lambda: (200, {"code": 0, "query": dict(request.query)}))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@asynccontextmanager
async def running_api(items: Sequence[dict[str, Any]] | None = None) -> AsyncIterator[ApiServer]:
    server = ApiServer(items=list(items) if items is not None else make_items(25))
    async with server:
        yield server


try:  # a fixture for any test module that imports it: ``from tests.httpapi import api_server``
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def api_server() -> AsyncIterator[ApiServer]:
        async with running_api() as server:
            yield server

except ImportError:  # pragma: no cover - pytest-asyncio is a dev dependency
    pass

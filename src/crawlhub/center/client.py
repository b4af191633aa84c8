"""A job's side of the download center: allocate agents, send downloads, get replies.

``async with CenterClient(bus, "my-job", strategy="fixed", agents=2) as center:
reply = await center.fetch("http://127.0.0.1:8600/")`` - the job keeps its own parsing
and scheduling; only its downloads travel. The failure rules of seed 001, as the job
sees them:

- **allocation** is synchronous: :meth:`open` returns once the center answered
  ``allocated``, and raises :class:`CenterError` when it refused (too few live agents,
  acks missing; the message has both numbers) or said nothing for ``allocate_timeout``
  s (no center running, or it is behind: the request expires and is dropped there).
- **broker errors** on a send are retried ``broker_retries`` times (default 10, doubling
  pauses from 0.05 s up to 2 s: an outage of about 11 s is outlived); then the call
  raises :class:`CenterError` - the job exits with it. The reply reader retries the same
  way, then fails every waiting request with it.
- **reply timeout**: a request unanswered for ``timeout`` s is sent again (same request
  id, ``attempt`` + 1), ``retries`` times; then :meth:`fetch` raises
  :class:`CenterError`: the system or the job is broken, the job reports and exits.
- **in-flight window**: while first sends minus replies exceed ``window`` (default
  100), new requests wait; if no reply arrives for ``timeout`` s meanwhile, they raise.
- **duplicate replies** (a late answer to a request sent again, or served twice by two
  centers) are dropped: each request is answered once (``duplicates`` counts them).

``skipped`` and ``failed`` replies are answers, not errors: :meth:`fetch` returns them
and the job's own retry decides (a chained request whose agent died).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

from crawlhub.center.bus import MALFORMED, Bus, BusError, Outbox
from crawlhub.center.messages import (
    FAILED,
    REQUESTS,
    SKIPPED,
    STRATEGIES,
    CenterError,
    Reply,
    check_id,
    job_channel,
)
from crawlhub.core import rejects
from crawlhub.core.clock import Clock, system_clock
from crawlhub.fetch.http import Request

log = logging.getLogger("crawlhub.center.client")

ALLOCATE_TIMEOUT = 10.0
TIMEOUT = 30.0
RETRIES = 3
WINDOW = 100
BROKER_RETRIES = 10
STATS_EVERY = 2.0


class _Expired(Exception):  # noqa: N818 - internal: a send's reply did not come in time
    """A request's send went unanswered for the client's ``timeout``."""


class CenterClient:
    """One job's connection to the download center.

    ``options`` go to every allocated agent: ``downloader`` (``headers``, ``cookies``,
    ``timeout``, ``max_size``, ``max_redirects``, ``proxies``), ``extract`` (extraction
    rules run on the agent: replies then carry ``fields``, ``links`` and ``title``) and
    ``body`` (False: replies carry no body, only what was extracted).
    """

    def __init__(self, bus: Bus, job: str | None = None, *, strategy: str = "random",
                 agents: int = 1, options: Mapping[str, Any] | None = None,
                 allocate_timeout: float = ALLOCATE_TIMEOUT, timeout: float = TIMEOUT,
                 retries: int = RETRIES, window: int = WINDOW,
                 broker_retries: int = BROKER_RETRIES, stats_every: float = STATS_EVERY,
                 clock: Clock = system_clock) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not"
                             f" {strategy!r}")
        if agents < (0 if strategy == "random" else 1):
            raise ValueError(f"agents must be at least 1 for {strategy}, not {agents!r}")
        if timeout <= 0 or allocate_timeout <= 0 or retries < 0 or window < 1:
            raise ValueError("timeout and allocate_timeout must be > 0, retries >= 0 and"
                             " window >= 1")
        self.bus = bus
        self.job = check_id(job or f"job-{uuid.uuid4().hex[:12]}", "job id")
        self.strategy = strategy
        self.n = agents
        self.options = dict(options or {})
        self.allocate_timeout = allocate_timeout
        self.timeout = timeout
        self.retries = retries
        self.window = window
        self.broker_retries = broker_retries
        self.stats_every = stats_every
        self.clock = clock
        self.channel = job_channel(self.job)
        #: the agents the center allocated
        self.agents: list[str] = []
        self.sent = 0
        self.returned = 0
        self.retried = 0
        self.failed = 0
        self.skipped = 0
        self.duplicates = 0
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        #: (loop time, future) of every send not known answered, in order; see _expire_after
        self._deadlines: deque[tuple[float, asyncio.Future[Reply]]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._allocating: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._returned_event = asyncio.Event()
        self._fatal: CenterError | None = None
        self._outbox = Outbox(bus, retries=broker_retries)
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._stats: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    async def __aenter__(self) -> CenterClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> list[str]:
        """Allocate agents (synchronous); the agents, or :class:`CenterError`."""
        self._reader = asyncio.create_task(self._read_forever())
        token = uuid.uuid4().hex
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._allocating[token] = fut
        now = self.clock()
        try:
            await self._send({"kind": "allocate", "job": self.job, "token": token,
                              "strategy": self.strategy, "n": self.n,
                              "options": self.options, "ts": now,
                              "exp": now + self.allocate_timeout})
            try:
                async with asyncio.timeout(self.allocate_timeout):
                    answer = await fut
            except TimeoutError:
                raise CenterError(
                    f"job {self.job}: no answer to its allocation ({self.strategy},"
                    f" {self.n} agents) in {self.allocate_timeout:g} s: is a download center"
                    f" running on {self.bus.url}?") from None
        except BaseException:
            await self._stop_reader()
            raise
        finally:
            self._allocating.pop(token, None)
        if answer.get("kind") != "allocated":
            await self._stop_reader()
            raise CenterError(f"job {self.job}: allocation refused: {answer.get('error')}")
        self.agents = [str(a) for a in answer.get("agents") or []]
        self._stats = asyncio.create_task(self._stats_forever())
        return self.agents

    async def close(self) -> None:
        """Release the allocation (the agents close the job's downloaders) and stop."""
        if self._stats is not None:
            self._stats.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._stats
            with contextlib.suppress(BusError, CenterError):
                await self._send(self._stats_message())
        with contextlib.suppress(BusError, CenterError):
            await self._send({"kind": "release", "job": self.job, "ts": self.clock()})
        await self._stop_reader()
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(CenterError(f"job {self.job} closed"))
                fut.exception()  # retrieved: nobody may be waiting
        self._waiting.clear()
        self._deadlines.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        with contextlib.suppress(BusError):
            await self.bus.delete(self.channel)

    async def _stop_reader(self) -> None:
        if self._reader is not None:
            # not a bare cancel: a blocking read cancelled inside redis-py can wait forever
            # on its connection; the reader sees the flag within one read's block
            self._closing = True
            done, _ = await asyncio.wait([self._reader], timeout=2.0)
            if not done:
                self._reader.cancel()
                await asyncio.wait([self._reader], timeout=2.0)
            self._reader = None

    async def _send(self, header: Mapping[str, Any], body: bytes = b"") -> None:
        try:
            await self._outbox.put(REQUESTS, header, body)
        except BusError as exc:
            raise CenterError(f"job {self.job}: the broker failed {self.broker_retries + 1}"
                              f" times in a row: {exc}") from exc

    # ------------------------------------------------------------------ downloads
    async def fetch(self, request: Request | str, *, agent: str | None = None,
                    extract: Any = None, depth: int | None = None,
                    render: Mapping[str, Any] | None = None) -> Reply:
        """Download ``request`` through the center. ``agent`` binds a chained request to
        the agent whose page it was found on; ``extract`` names (or holds) the rule set
        the agent extracts with; ``depth`` is passed to link extraction; ``render`` (a
        ``RenderWait`` mapping: ``wait_until``, ``wait_for``) has the agent render the
        page in its headless Chromium instead of fetching it over HTTP."""
        if self._fatal is not None:
            raise self._fatal
        await self._wait_window()
        req = Request(request) if isinstance(request, str) else request
        rid = f"{self._prefix}-{next(self._ids)}"
        header: dict[str, Any] = {"kind": "download", "job": self.job, "rid": rid,
                                  "url": req.url, "method": req.method}
        if req.headers:
            header["headers"] = dict(req.headers)
        if agent:
            header["agent"] = agent
        if extract is not None:
            header["extract"] = extract
        if depth is not None:
            header["depth"] = depth
        if render is not None:
            header["render"] = dict(render)
        body = req.data.encode() if isinstance(req.data, str) else (req.data or b"")
        loop = asyncio.get_running_loop()
        self.sent += 1
        fut: asyncio.Future[Reply] | None
        try:
            for attempt in range(1, self.retries + 2):
                now = self.clock()
                # One future per send, woken once: by the reply, by the broker's failure
                # to send it (the outbox sets it) or by the deadline (one timer for all
                # requests, see _expire_after). No timeout context or shield per request.
                fut = loop.create_future()
                self._waiting[rid] = fut
                self._expire_after(fut, loop)
                self._outbox.put_nowait(REQUESTS, {**header, "attempt": attempt, "ts": now,
                                                   "exp": now + self.timeout}, body,
                                        waiter=fut)
                try:
                    reply = await fut
                except BusError as exc:
                    raise CenterError(f"job {self.job}: the broker failed"
                                      f" {self.broker_retries + 1} times in a row: {exc}"
                                      ) from exc
                except _Expired:
                    if self._fatal is not None:
                        raise self._fatal from None
                    if attempt <= self.retries:
                        self.retried += 1
                        continue
                    self.failed += 1
                    raise CenterError(
                        f"job {self.job}: request {rid} ({req.url}) unanswered after"
                        f" {attempt} sends, {self.timeout:g} s each: the center, its agents"
                        f" or the broker are down") from None
                reply.attempts = attempt
                if reply.status == SKIPPED:
                    self.skipped += 1
                elif reply.status == FAILED:
                    self.failed += 1
                return reply
            raise AssertionError("unreachable")
        finally:
            fut = self._waiting.pop(rid, None)
            if fut is not None and not fut.done():  # the caller gave up (cancelled)
                fut.cancel()

    def _expire_after(self, fut: asyncio.Future[Reply], loop: asyncio.AbstractEventLoop
                      ) -> None:
        """Fail ``fut`` with :class:`_Expired` once ``timeout`` s have passed unless it is
        done by then. Every request has the same timeout, so deadlines come in the order
        they were set: a deque, and one timer for its head."""
        self._deadlines.append((loop.time() + self.timeout, fut))
        if self._sweeper is None:
            self._sweeper = loop.call_at(self._deadlines[0][0], self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        deadlines = self._deadlines
        if not deadlines:
            return
        loop = deadlines[0][1].get_loop()
        now = loop.time()
        while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now):
            _, fut = deadlines.popleft()
            if not fut.done():
                fut.set_exception(_Expired())
        if deadlines:
            self._sweeper = loop.call_at(deadlines[0][0], self._sweep)

    def _forget_done(self) -> None:
        """Drop answered requests from the head of the deadlines (replies come back
        roughly in order, so it stays about the window's size)."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():
            deadlines.popleft()

    async def _wait_window(self) -> None:
        while len(self._waiting) >= self.window:
            self._returned_event.clear()
            try:
                async with asyncio.timeout(self.timeout):
                    await self._returned_event.wait()
            except TimeoutError:
                raise CenterError(
                    f"job {self.job}: {len(self._waiting)} requests in flight (window"
                    f" {self.window}) and no reply for {self.timeout:g} s: stopping") from None
            if self._fatal is not None:
                raise self._fatal

    async def _read_forever(self) -> None:
        """Read replies; a batch is acked in the trip of the next read (no round trip of
        its own while replies wait), the last one on the way out."""
        failures = 0
        pause = 0.1
        done: list[str] = []
        while not self._closing:
            try:
                envs = await self.bus.read(self.channel, self.job, count=1000, block=0.5,
                                           ack={self.channel: done})
                done = []
            except BusError as exc:
                failures += 1
                if failures > self.broker_retries:
                    self._fail(CenterError(f"job {self.job}: reading replies failed"
                                           f" {failures} times in a row: {exc}"))
                    return
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
                continue
            failures, pause = 0, 0.1
            for env in envs:
                try:
                    self._receive(env.header, env.body)
                except MALFORMED as exc:  # one bad reply must not end the reader
                    with contextlib.suppress(BusError):
                        await self.bus.reject(self.channel, env, rejects.MALFORMED,
                                              f"{type(exc).__name__}: {exc}")
            done = [e.id for e in envs]
        if done:
            with contextlib.suppress(BusError):
                await self.bus.ack(self.channel, done)

    def _receive(self, h: dict[str, Any], body: bytes) -> None:
        kind = h.get("kind")
        if kind == "reply":
            rid = str(h.get("rid") or "")
            fut = self._waiting.get(rid)
            if fut is None or fut.done():
                self.duplicates += 1
                return
            reply = Reply.from_message(h, body)  # a malformed reply raises before counting
            self.returned += 1
            fut.set_result(reply)
            self._returned_event.set()
            self._forget_done()
        elif kind in ("allocated", "refused"):
            waiter = self._allocating.get(str(h.get("token") or ""))
            if waiter is not None and not waiter.done():
                waiter.set_result(h)

    def _fail(self, error: CenterError) -> None:
        self._fatal = error
        log.error("%s", error)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(error)
        for waiter in self._allocating.values():
            if not waiter.done():
                waiter.set_exception(error)
        self._returned_event.set()

    # ------------------------------------------------------------------ stats
    def _stats_message(self) -> dict[str, Any]:
        return {"kind": "stats", "job": self.job, "sent": self.sent, "returned": self.returned,
                "in_flight": self.in_flight, "failed": self.failed, "skipped": self.skipped,
                "retried": self.retried, "ts": self.clock()}

    async def _stats_forever(self) -> None:
        while True:
            await asyncio.sleep(self.stats_every)
            with contextlib.suppress(BusError, CenterError):
                await self._send(self._stats_message())

    def stats(self) -> dict[str, Any]:
        return {"job": self.job, "strategy": self.strategy, "agents": list(self.agents),
                "sent": self.sent, "returned": self.returned, "in_flight": self.in_flight,
                "failed": self.failed, "skipped": self.skipped, "retried": self.retried,
                "duplicates": self.duplicates, "time": time.time()}

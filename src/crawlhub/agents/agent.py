"""The downloader agent: lease URL tasks, fetch, extract, report results, ack.

Flow of one task: lease (in batches from one or more outbound queues) -> robots.txt
(optional: a disallowed URL is not fetched, its result is ``robots_disallowed``, 2007, and
it is acked like any other) -> domain gate (optional) -> downloader -> extraction rules -> the page goes to ``on_pages`` (crawl mode:
links to the frontier, items to the sink) -> its result ``{task_uuid, routed_count,
task_result}`` goes to the hub -> ack. Pages are handled in *flushes* of up to
``flush_size``: one ``on_pages`` call, one report, one ack per queue, so a flush of 200
pages costs 3 backend round trips, not 600. A task is acked only after its result was
recorded: an agent killed at any point loses nothing (its leases expire, another agent or
its restart leases them again; a result reported twice is stale at the hub).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from crawlhub.agents.codes import PARSE_ERROR, ROBOTS_DISALLOWED, SUCCESS, ResultCodes
from crawlhub.agents.downloader import Downloader, Fetched
from crawlhub.agents.extract import Extracted, ExtractionRules, ParseError
from crawlhub.queues.base import Message, ReliableQueue
from crawlhub.task import RESULT_KEY

log = logging.getLogger("crawlhub.agents.agent")

#: Seconds a lease lasts; a flush extends nothing, so keep it well above fetch + flush.
LEASE_SECONDS = 120.0
#: Seconds between two polls of empty queues.
IDLE_POLL = 0.05
#: Seconds before leasing again after a backend error.
LEASE_RETRY = 1.0


@dataclass(slots=True)
class Page:
    """One task done: its leased message, the download and what was extracted."""

    queue: str
    message: Message
    fetched: Fetched
    extracted: Extracted | None
    code: int
    #: done before (``skip`` said so): reported as a success, not fetched
    skipped: bool = False

    @property
    def task(self) -> dict[str, Any]:
        return self.message.payload

    def result(self) -> dict[str, Any]:
        """The result message the hub settles this task's ledger entry with."""
        task = self.message.payload
        out: dict[str, Any] = {"task_uuid": task.get("task_uuid"), RESULT_KEY: self.code}
        if "routed_count" in task:
            out["routed_count"] = task["routed_count"]
        return out


Report = Callable[[list[dict[str, Any]]], Awaitable[Any]]
OnPages = Callable[[list[Page]], Awaitable[Any]]
Skip = Callable[[Sequence[Message]], Awaitable[set[str]]]


class HubReport:
    """Reports results to a hub in this process (``Hub.receive`` on a result inbound)."""

    def __init__(self, hub: Any, inbound: str) -> None:
        self.hub, self.inbound = hub, inbound

    async def __call__(self, results: list[dict[str, Any]]) -> None:
        await self.hub.receive(self.inbound, results, wait=True)


class RedisListReport:
    """Reports results (and new tasks) to the hub's Redis list inbound: one RPUSH a flush."""

    def __init__(self, url: str, key: str) -> None:
        from crawlhub.storage import redis_client

        self.client = redis_client(url, name="agent results")
        self.key = key

    async def __call__(self, messages: list[dict[str, Any]]) -> None:
        if messages:
            await self.client.rpush(self.key, *[json.dumps(m, separators=(",", ":"))
                                                for m in messages])

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.aclose()


@dataclass
class AgentStats:
    pages: int = 0
    errors: int = 0
    leased: int = 0
    by_code: dict[int, int] = field(default_factory=dict)


class Agent:
    """Works through ``queues`` (name -> queue) until stopped or, with ``until_idle``,
    until that coroutine says the work is done while the agent holds none.

    ``report`` records results (``HubReport`` / ``RedisListReport``), ``on_pages`` gets
    each flush before its report (crawl mode writes items and admits links there).
    ``gate`` is an optional ``DomainGate``; ``registry`` an optional ``AgentRegistry``.
    ``robots`` (anything with ``allowed(url, user_agent)``: a ``DomainGate`` opened with
    robots, or a ``RobotsCache``) is asked before each fetch, for the downloader's
    User-Agent; its rules are parsed once per origin and kept in memory, so a check on the
    hot path is a dict lookup and a Protego match.
    """

    def __init__(
        self,
        queues: dict[str, ReliableQueue],
        downloader: Downloader,
        *,
        report: Report,
        rules: ExtractionRules | None = None,
        codes: ResultCodes | None = None,
        on_pages: OnPages | None = None,
        concurrency: int = 64,
        lease_batch: int | None = None,
        flush_size: int = 200,
        flush_every: float = 0.1,
        lease_seconds: float = LEASE_SECONDS,
        gate: Any | None = None,
        registry: Any | None = None,
        agent_id: str | None = None,
        skip: Skip | None = None,
        keep_body: bool = False,
        robots: Any | None = None,
        heartbeat_every: float = 2.0,
    ) -> None:
        if not queues:
            raise ValueError("an agent needs at least one queue to lease from")
        self.queues = queues
        self.downloader = downloader
        self.report = report
        self.rules = rules or ExtractionRules()
        self.codes = codes or ResultCodes()
        self.on_pages = on_pages
        self.concurrency = concurrency
        # two rounds of work: enough to keep every slot busy between leases, few enough
        # that a slow site does not let buffered leases expire before they are fetched
        self.lease_batch = lease_batch or min(max(2 * concurrency, 16), 512)
        self.flush_size = flush_size
        self.flush_every = flush_every
        self.lease_seconds = lease_seconds
        self.gate = gate
        self.registry = registry
        self.robots = robots
        self.user_agent = downloader.config.user_agent
        self.heartbeat_every = heartbeat_every
        self.agent_id = agent_id or f"{socket.gethostname()}-{os.getpid()}"
        #: URLs among a leased batch already done (a resumed crawl's written items)
        self.skip = skip
        #: keep each page's body for ``on_pages`` (else dropped once extracted)
        self.keep_body = keep_body
        self.stats = AgentStats()
        self._ready: deque[tuple[str, Message]] = deque()
        self._outbox: list[Page] = []
        self._inflight = 0
        self._flushing: asyncio.Task[None] | None = None
        #: set while the outbox has room: workers wait on it (memory stays bounded when
        #: fetching outruns flushing)
        self._room = asyncio.Event()
        self._room.set()
        self._wake = asyncio.Event()
        self._started = time.monotonic()

    # ------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event | None = None,
                  until_idle: Callable[[], Awaitable[bool]] | None = None) -> None:
        stop = stop or asyncio.Event()
        beat = asyncio.create_task(self._beat_forever(stop)) if self.registry else None
        workers = [asyncio.create_task(self._worker(stop)) for _ in range(self.concurrency)]
        flusher = asyncio.create_task(self._flush_forever(stop))
        try:
            await self._feed(stop, until_idle)
        finally:
            stop.set()
            self._wake.set()
            for w in workers:
                w.cancel()
            for w in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
            # What was leased and not done returns to ready when its lease ends.

    async def _feed(self, stop: asyncio.Event,
                    until_idle: Callable[[], Awaitable[bool]] | None) -> None:
        """Keep about two leases' worth of work buffered; end when told or idle."""
        names = list(self.queues)
        turn = 0
        while not stop.is_set():
            if len(self._ready) < self.concurrency:
                got = 0
                for k in range(len(names)):
                    name = names[(turn + k) % len(names)]
                    try:
                        messages = await self.queues[name].lease(self.lease_batch,
                                                                 self.lease_seconds)
                    except Exception as exc:
                        # the queue's backend is out: keep trying, the work waits there
                        log.warning("agent %s: leasing from %s failed (%s); trying again in"
                                    " %s s", self.agent_id, name, exc, LEASE_RETRY)
                        await asyncio.sleep(LEASE_RETRY)
                        continue
                    if messages and self.skip is not None:
                        messages = await self._skip_done(name, messages)
                    self._ready.extend((name, m) for m in messages)
                    got += len(messages)
                    if messages:
                        break
                turn += 1
                self.stats.leased += got
                if got:
                    self._wake.set()
                    continue
                if (until_idle is not None and not self._ready and not self._inflight
                        and not self._outbox and self._flushing is None
                        and await until_idle()):
                    return
            await asyncio.sleep(IDLE_POLL)

    async def _skip_done(self, name: str, messages: list[Message]) -> list[Message]:
        assert self.skip is not None
        done = await self.skip(messages)
        if not done:
            return messages
        keep = []
        for m in messages:
            url = str(m.payload.get("url") or "")
            if url in done:
                fetched = Fetched(url, url, 0, {}, b"", 0.0, None, SUCCESS)
                self._outbox.append(Page(name, m, fetched, None, self.codes.success,
                                         skipped=True))
            else:
                keep.append(m)
        return keep

    async def _worker(self, stop: asyncio.Event) -> None:
        ready = self._ready
        while not stop.is_set():
            if not ready:
                self._wake.clear()
                await self._wake.wait()
                continue
            name, message = ready.popleft()
            self._inflight += 1
            try:
                page = await self._do(name, message)
            finally:
                self._inflight -= 1
            if not self.keep_body:
                page.fetched.body = b""
            self._outbox.append(page)
            if len(self._outbox) >= self.flush_size:
                if self._flushing is None:
                    self._start_flush()
                elif len(self._outbox) >= 2 * self.flush_size:
                    self._room.clear()
                    await self._room.wait()

    async def _do(self, name: str, message: Message) -> Page:
        task = message.payload
        url = str(task.get("url") or "")
        if self.robots is not None and not await self._robots_allow(url):
            refused = Fetched(url, url, 0, {}, b"", 0.0, None, ROBOTS_DISALLOWED,
                              attempts=0, error="disallowed by robots.txt")
            return Page(name, message, refused, None, self.codes.code(ROBOTS_DISALLOWED))
        slot = None
        gate: Any = self.gate
        if gate is not None:
            from crawlhub.agents.politeness.gate import domain_of

            slot = await gate.acquire(domain_of(url))
        status: int | None = None
        fetched: Fetched | None = None
        try:
            fetched = await self.downloader.fetch(url, job=str(task.get("job") or ""))
            status = fetched.status or None
        finally:
            if slot is not None and gate is not None:
                from crawlhub.agents.politeness.gate import retry_after_seconds

                retry_after = None
                if fetched is not None and status:
                    retry_after = retry_after_seconds(fetched.headers.get("Retry-After"),
                                                      time.time())
                await gate.release(slot, status, retry_after)
        extracted: Extracted | None = None
        code = self.codes.code(fetched.outcome, fetched.status)
        if fetched.ok:
            try:
                extracted = self.rules.extract(fetched.body, fetched.final_url,
                                               depth=int(task.get("depth") or 0),
                                               content_type=fetched.content_type)
            except ParseError as exc:
                fetched.outcome, fetched.error = PARSE_ERROR, str(exc)
                code = self.codes.code(PARSE_ERROR, fetched.status)
        return Page(name, message, fetched, extracted, code)

    async def _robots_allow(self, url: str) -> bool:
        try:
            robots: Any = self.robots
            return bool(await robots.allowed(url, self.user_agent))
        except ValueError:
            return True  # not an absolute http(s) URL: the downloader reports it

    # ------------------------------------------------------------------ flushing
    def _start_flush(self) -> None:
        pages, self._outbox = self._outbox, []
        self._flushing = asyncio.create_task(self._flush(pages))
        self._room.set()

    async def _flush_forever(self, stop: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.flush_every)
            if self._flushing is not None:
                with contextlib.suppress(Exception):
                    await self._flushing
                continue
            if self._outbox:
                self._start_flush()

    async def _flush(self, pages: list[Page]) -> None:
        """on_pages, report, ack: one call each for the whole flush. A failure leaves
        the tasks leased: they come back when their leases end."""
        try:
            if self.on_pages is not None:
                await self.on_pages(pages)
            await self.report([p.result() for p in pages])
            by_queue: dict[str, list[str]] = {}
            for p in pages:
                by_queue.setdefault(p.queue, []).append(p.message.receipt)
            for name, receipts in by_queue.items():
                await self.queues[name].ack(receipts)
            stats = self.stats
            for p in pages:
                stats.pages += 1
                if not p.fetched.ok:
                    stats.errors += 1
                stats.by_code[p.code] = stats.by_code.get(p.code, 0) + 1
        except Exception:
            log.exception("agent %s: a flush of %d pages failed; their leases will expire"
                          " and they will be fetched again", self.agent_id, len(pages))
        finally:
            self._flushing = None
            if len(self._outbox) >= self.flush_size:
                self._start_flush()

    async def drain(self) -> None:
        """Flush what is done (used before a clean stop)."""
        if self._flushing is not None:
            await self._flushing
        if self._outbox:
            self._start_flush()
            assert self._flushing is not None
            await self._flushing

    # ------------------------------------------------------------------ registry
    async def _beat_forever(self, stop: asyncio.Event) -> None:
        from crawlhub.agents.registry.base import LoadMeter

        await self._register()
        meter = LoadMeter()
        last = (time.monotonic(), 0)
        while not stop.is_set():
            await asyncio.sleep(self.heartbeat_every)
            now = time.monotonic()
            qps = (self.stats.pages - last[1]) / max(now - last[0], 1e-6)
            last = (now, self.stats.pages)
            await self.heartbeat(meter, qps)

    async def _register(self) -> bool:
        from crawlhub import __version__
        from crawlhub.agents.registry.base import AgentInfo

        registry: Any = self.registry
        try:
            await registry.register(AgentInfo(
                agent_id=self.agent_id, host=socket.gethostname(), pid=os.getpid(),
                version=str(__version__), queues=list(self.queues),
                started=time.time() - (time.monotonic() - self._started),
                concurrency=self.concurrency))
        except Exception:
            log.exception("agent %s: registering failed", self.agent_id)
            return False
        return True

    async def heartbeat(self, meter: Any, qps: float = 0.0) -> bool:
        """Send one heartbeat (memory and CPU from ``meter``, a ``LoadMeter``); when the
        registry answers that it does not know this agent (forgotten after its retention,
        or its registration failed), register again and send the beat once more. Whether
        the beat was stored."""
        from crawlhub.agents.registry.base import Heartbeat

        registry: Any = self.registry
        memory, cpu = meter.sample()
        beat = Heartbeat(in_flight=self._inflight, downloaders=self._inflight, qps=qps,
                         pages=self.stats.pages, errors=self.stats.errors,
                         memory=memory, cpu=cpu)
        try:
            if await registry.heartbeat(self.agent_id, beat):
                return True
            log.warning("agent %s: the registry forgot this agent; registering again",
                        self.agent_id)
            if not await self._register():
                return False
            return bool(await registry.heartbeat(self.agent_id, beat))
        except Exception:  # noqa: BLE001 - the backend is out: beat again next time
            log.warning("agent %s: heartbeat failed", self.agent_id, exc_info=True)
            return False

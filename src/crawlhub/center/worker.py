"""The agent's side of the download center: serve the commands of its own channel.

``crawlhub agent --center URL --id NAME`` runs one. It registers once (channel
``register``) and beats every ``beat_every`` s (channel ``beats``) for as long as it runs,
the broker down or not; it reads ``agent:<id>`` (its pending commands first after a
restart, retrying forever while the broker is down) and serves:

- ``allocate``: creates the job's downloader - the agent's own downloader settings
  (proxies, ban rules, limits) with the job's headers, cookies and timeouts - and its
  extraction rules, saves the allocation to ``<state_dir>/center-<id>.json`` and acks to
  the center (retried ``send_retries`` times, then dropped: the center refuses the job);
- ``download``: fetches through the agent's domain gate (per-domain politeness, shared by
  every job) with the job's downloader, extracts with the job's rules, replies to the
  job (body included unless the job asked for extraction only) and acks the command;
  one with ``render`` is rendered in the agent's headless Chromium (``render_config``:
  one browser for every job, each job in a context of its own with its downloader's
  cookies and headers);
  a command past its ``exp`` is dropped: its job retried or gave up;
- ``release``: closes the job's downloader and pages and forgets the allocation (file
  included);
- ``allocations``: the center's list of this agent's current jobs after it registered:
  allocations the file kept but the center no longer holds are dropped;
- ``register`` (the center does not know this agent): registers again; ``exit``: stops.

Downloaders are isolated by job id (own cookie jar, headers and connection pool); one
unused for ``idle_release`` s is closed, its allocation kept, and made again on the next
download. Allocations survive a restart through the file: the agent reloads it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from crawlhub.agents.browser import BrowserDownloader, render_wait
from crawlhub.agents.config import RenderConfig, RenderWait
from crawlhub.agents.downloader import Downloader, DownloaderConfig, Fetched
from crawlhub.agents.extract import ExtractionRules, ParseError, RuleSets
from crawlhub.agents.proxies import ProxyPool
from crawlhub.agents.registry.base import LoadMeter
from crawlhub.center.bus import (
    MALFORMED,
    Bus,
    BusError,
    Envelope,
    Outbox,
    retry_forever,
    wait_until,
)
from crawlhub.center.messages import (
    BEATS,
    FAILED,
    OK,
    REGISTER,
    agent_channel,
    check_id,
    job_channel,
)
from crawlhub.core import rejects
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.errors import ConfigError
from crawlhub.fetch.http import Request

log = logging.getLogger("crawlhub.center.worker")

IDLE_RELEASE = 300.0
#: Beyond its allocation's window, how long a new job is kept by a list of this agent's
#: jobs that does not name it (the list's way from the center, the clocks of two hosts)
SETTLE_GRACE = 10.0
BEAT_EVERY = 3.0
SEND_RETRIES = 3
#: Headers a job may not set on an agent's requests (the agent's connection owns them).
_HOP_HEADERS = frozenset(("host", "content-length", "transfer-encoding", "connection"))


class _Job:
    __slots__ = ("job", "options", "downloader", "rendered", "rules", "body", "last_used",
                 "active", "allocated", "settling")

    def __init__(self, job: str, options: dict[str, Any], rules: RuleSets | None,
                 body: bool, allocated: float) -> None:
        self.job = job
        self.options = options
        self.downloader: Downloader | None = None
        #: its downloader has rendered pages in the agent's browser (a context of its own)
        self.rendered = False
        self.rules = rules
        self.body = body
        self.last_used = time.monotonic()
        self.active = 0
        self.allocated = allocated
        #: (monotonic) until when a center's list of this agent's jobs may not know it
        #: yet: the list was read before the allocation was stored (see "allocations")
        self.settling = 0.0


def job_downloader_config(base: DownloaderConfig, options: dict[str, Any]) -> DownloaderConfig:
    """The agent's downloader settings with the job's ``downloader`` options over them:
    ``headers`` merged (the job's win), ``timeout``, ``max_size``, ``max_redirects``
    replaced; a bad option is a ``ConfigError`` naming ``downloader.<key>``."""
    given = dict(options.get("downloader") or {})
    allowed = {"headers", "cookies", "timeout", "max_size", "max_redirects", "proxies"}
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ConfigError(f"unknown downloader option(s) {', '.join(unknown)}; a job may set"
                          f" {', '.join(sorted(allowed))}", key=f"downloader.{unknown[0]}")
    data = base.model_dump()
    headers = {str(k): str(v) for k, v in (given.get("headers") or {}).items()
               if str(k).lower() not in _HOP_HEADERS}
    data["headers"] = {**data["headers"], **headers}
    for key in ("timeout", "max_size", "max_redirects"):
        if key in given:
            data[key] = given[key]
    if "proxies" in given:
        data["proxies"] = given["proxies"]
    return DownloaderConfig.from_config(data)


class CenterWorker:
    """Serves one agent id's command channel. ``downloader_config`` / ``proxies`` are the
    agent's own (every job's downloader starts from them; the proxy pool - bans,
    cooldowns - is shared by jobs that set no proxies of their own); ``gate`` an
    optional :class:`~crawlhub.agents.politeness.gate.DomainGate`."""

    def __init__(self, bus: Bus, agent_id: str | None = None, *,
                 downloader_config: DownloaderConfig | None = None,
                 proxies: ProxyPool | None = None, gate: Any | None = None,
                 concurrency: int = 64, state_dir: str | Path | None = None,
                 idle_release: float = IDLE_RELEASE, beat_every: float = BEAT_EVERY,
                 send_retries: int = SEND_RETRIES, labels: dict[str, str] | None = None,
                 render_config: RenderConfig | None = None,
                 clock: Clock = system_clock) -> None:
        self.bus = bus
        self.agent_id = check_id(agent_id or f"{socket.gethostname()}-{os.getpid()}",
                                 "agent id")
        self.config = downloader_config or DownloaderConfig()
        self.proxies = proxies if proxies is not None else ProxyPool.from_config(
            self.config.proxies)
        self.gate = gate
        self.concurrency = concurrency
        self.state_file = (Path(state_dir) / f"center-{self.agent_id}.json"
                           if state_dir is not None else None)
        self.idle_release = idle_release
        self.beat_every = beat_every
        self.send_retries = send_retries
        self.labels = labels or {}
        #: how this agent renders a download asking for it (``agent.render``)
        self.render_config = render_config or RenderConfig()
        #: the browser every job renders in (launched by the first ``render`` request)
        self.browser: BrowserDownloader | None = None
        self.clock = clock
        self.jobs: dict[str, _Job] = {}
        self.outbox = Outbox(bus, retries=send_retries)
        self.pages = 0
        self.errors = 0
        self.stale = 0
        self.released_idle = 0
        self._inflight = 0
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._registered = False
        self._started = time.time()
        self.stop_event: asyncio.Event | None = None

    @property
    def channel(self) -> str:
        return agent_channel(self.agent_id)

    # ------------------------------------------------------------------ state file
    def load(self) -> int:
        """Reload the allocations the state file kept; how many."""
        if self.state_file is None or not self.state_file.exists():
            return 0
        try:
            saved = json.loads(self.state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("agent %s: cannot read %s (%s); starting with no allocation",
                        self.agent_id, self.state_file, exc)
            return 0
        for job, entry in (saved.get("jobs") or {}).items():
            try:
                self._install(job, dict(entry.get("options") or {}),
                              float(entry.get("allocated") or 0))
            except (ConfigError, ValueError) as exc:
                log.warning("agent %s: dropped saved allocation of job %s: %s",
                            self.agent_id, job, exc)
        return len(self.jobs)

    def save(self) -> None:
        if self.state_file is None:
            return
        data = {"agent_id": self.agent_id,
                "jobs": {j.job: {"options": j.options, "allocated": j.allocated}
                         for j in self.jobs.values()}}
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.state_file)

    def _install(self, job: str, options: dict[str, Any], allocated: float) -> _Job:
        check_id(job, "job id")
        job_downloader_config(self.config, options)  # validate now, build when used
        rules: RuleSets | None = None
        if options.get("extract") is not None:
            extract = options["extract"]
            if not isinstance(extract, dict):
                raise ConfigError("expected a mapping with 'fields', 'links' and/or 'rules'",
                                  key="extract")
            rules = RuleSets.from_config(extract)
        entry = _Job(job, options, rules, bool(options.get("body", True)), allocated)
        self.jobs[job] = entry
        return entry

    async def _drop(self, job: str) -> bool:
        entry = self.jobs.pop(job, None)
        if entry is None:
            return False
        await self._close(entry)
        return True

    async def _close(self, entry: _Job) -> None:
        """Close a job's pages in the agent's browser and its downloader (made again on
        its next download)."""
        downloader, entry.downloader = entry.downloader, None
        rendered, entry.rendered = entry.rendered, False
        try:
            if rendered and self.browser is not None and downloader is not None:
                await self.browser.forget(entry.job, downloader)
        finally:
            if downloader is not None:
                await downloader.close()

    # ------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = self.stop_event = stop or asyncio.Event()
        self.load()
        tasks = [asyncio.create_task(self._beat_forever(stop)),
                 asyncio.create_task(self._read_forever(stop)),
                 asyncio.create_task(self._idle_forever(stop))]
        try:
            await stop.wait()
        finally:
            from crawlhub.center.center import _end

            await _end(tasks)
            # Cancelled (a crash as seen from outside) or stopped, no loop outlives this.
            # On Redis a halted agent's beat loop was seen beating on with its cancel
            # pending (Task.cancelling() == 1): something below swallowed the cancel, and
            # the agent stayed alive to the center for ever (1 run in 4 of the dead-agent
            # test). A loop that missed its cancel ends at its next turn.
            stop.set()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5.0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.outbox.drain(), 5.0)
            for entry in self.jobs.values():
                await self._close(entry)
            browser, self.browser = self.browser, None
            if browser is not None:
                await browser.close()

    async def register(self) -> None:
        from crawlhub import __version__

        info = {"agent_id": self.agent_id, "host": socket.gethostname(), "pid": os.getpid(),
                "version": str(__version__), "queues": [], "started": self._started,
                "concurrency": self.concurrency, "labels": self.labels}
        await self.bus.send(REGISTER, {"kind": "register", "info": info, "ts": self.clock()})
        self._registered = True

    def beat_message(self, meter: LoadMeter, qps: float) -> dict[str, Any]:
        memory, cpu = meter.sample()
        return {"kind": "beat", "agent": self.agent_id, "ts": self.clock(), "beat": {
            "memory": memory, "cpu": cpu,
            "downloaders": sum(1 for j in self.jobs.values() if j.downloader is not None),
            "in_flight": self._inflight, "qps": round(qps, 1), "pages": self.pages,
            "errors": self.errors, "jobs": sorted(self.jobs)}}

    async def _beat_forever(self, stop: asyncio.Event) -> None:
        """Register, then beat forever: a broker outage is logged once and outlived."""
        meter = LoadMeter()
        last = (time.monotonic(), 0)
        down = False
        while not stop.is_set():
            try:
                if not self._registered:
                    await self.register()
                now = time.monotonic()
                qps = (self.pages - last[1]) / max(now - last[0], 1e-6)
                last = (now, self.pages)
                await self.bus.send_many([(BEATS, self.beat_message(meter, qps), b"")],
                                         maxlen=10_000)
                if down:
                    log.warning("agent %s: the broker answers again", self.agent_id)
                    down = False
            except BusError as exc:
                if not down:
                    log.warning("agent %s: heartbeat failed (%s); beating on", self.agent_id,
                                exc)
                    down = True
            await _nap(stop, self.beat_every if not down else min(self.beat_every, 1.0))

    async def _read_forever(self, stop: asyncio.Event) -> None:
        pending = True

        async def step() -> None:
            nonlocal pending
            free = max(1, self.concurrency - self._inflight)
            envs = await self.bus.read(self.channel, self.agent_id, count=free, block=1.0,
                                       pending=pending)
            pending = False
            for env in envs:
                try:
                    await self._command(env)
                except MALFORMED as exc:  # one bad command must not stop the others
                    await self.bus.reject(self.channel, env, rejects.MALFORMED,
                                          f"{type(exc).__name__}: {exc}")
                    self.outbox.ack_nowait(self.channel, env.id)
                if stop.is_set():
                    return
            while self._inflight >= self.concurrency and not stop.is_set():
                await self._slot_free()

        await retry_forever(stop, step, logger=log, who=f"agent {self.agent_id}",
                            what="reading commands", longest=2.0)

    async def _slot_free(self) -> None:
        await self._slots.acquire()
        self._slots.release()

    async def _idle_forever(self, stop: asyncio.Event) -> None:
        every = max(0.05, min(self.idle_release / 4, 30.0))
        while not stop.is_set():
            await _nap(stop, every)
            await self.release_idle()

    async def release_idle(self) -> int:
        """Close the downloaders of jobs unused for ``idle_release`` s; how many."""
        now = time.monotonic()
        closed = 0
        for entry in list(self.jobs.values()):
            if (entry.downloader is not None
                    and entry.active == 0 and now - entry.last_used >= self.idle_release):
                await self._close(entry)
                closed += 1
        self.released_idle += closed
        return closed

    # ------------------------------------------------------------------ commands
    async def _command(self, env: Envelope) -> None:
        h = env.header
        kind = h.get("kind")
        if kind == "download":
            if float(h.get("exp") or 0) <= self.clock():
                self.stale += 1
                self.outbox.ack_nowait(self.channel, env.id)
                return
            self._inflight += 1
            await self._slots.acquire()
            task = asyncio.create_task(self._download(env))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        try:
            if kind == "allocate":
                await self._allocate(h)
            elif kind == "release":
                if await self._drop(str(h.get("job") or "")):
                    self.save()
            elif kind == "allocations":
                # A list read while an allocation of this agent was being made (its acks
                # awaited, not stored yet) lacks that job, and arrives after its
                # ``allocate``: a job allocated here within its allocation's window is
                # kept (the center releases it if the allocation failed).
                current = set(h.get("jobs") or [])
                now = time.monotonic()
                dropped = [j for j, e in list(self.jobs.items())
                           if j not in current and e.settling <= now]
                for job in dropped:
                    await self._drop(job)
                if dropped:
                    log.info("agent %s: dropped allocations the center no longer holds: %s",
                             self.agent_id, ", ".join(dropped))
                    self.save()
            elif kind == "register":
                self._registered = False
                with contextlib.suppress(BusError):
                    await self.register()
            elif kind == "exit":
                log.warning("agent %s: told to exit", self.agent_id)
                if self.stop_event is not None:
                    self.stop_event.set()
        finally:
            self.outbox.ack_nowait(self.channel, env.id)

    async def _allocate(self, h: dict[str, Any]) -> None:
        job = str(h.get("job") or "")
        reply_to = str(h.get("reply_to") or "")
        ack: dict[str, Any] = {"kind": "allocated", "job": job, "token": h.get("token"),
                               "agent": self.agent_id, "ok": True, "ts": self.clock()}
        if float(h.get("exp") or 0) <= self.clock():
            self.stale += 1
            return
        try:
            old = self.jobs.get(job)
            if old is not None:
                await self._close(old)
            entry = self._install(job, dict(h.get("options") or {}), self.clock())
            entry.settling = time.monotonic() + _window(h) + SETTLE_GRACE
            self.save()
        except (ConfigError, ValueError) as exc:
            self.jobs.pop(job, None)
            ack.update(ok=False, error=str(exc))
        if reply_to:
            try:
                await self.outbox.put(reply_to, ack)
            except BusError:
                log.warning("agent %s: the ack of job %s's allocation was dropped after %d"
                            " tries", self.agent_id, job, self.send_retries + 1)

    def _downloader(self, entry: _Job) -> Downloader:
        if entry.downloader is None:
            config = job_downloader_config(self.config, entry.options)
            own = "proxies" in (entry.options.get("downloader") or {})
            entry.downloader = Downloader(config, proxies=None if own else self.proxies)
            cookies = (entry.options.get("downloader") or {}).get("cookies") or {}
            if cookies:
                entry.downloader.seed_cookies(entry.job, cookies)
        return entry.downloader

    async def _download(self, env: Envelope) -> None:
        h = env.header
        job = str(h.get("job") or "")
        try:
            header, body = await self._serve(h, env.body)
        except Exception as exc:  # noqa: BLE001 - a bug must not lose the answer
            log.exception("agent %s: download of job %s failed", self.agent_id, job)
            header, body = _reply(h, self.agent_id, FAILED, error=f"agent error: {exc}"), b""
        finally:
            self._inflight -= 1
            self._slots.release()
        self.outbox.put_nowait(job_channel(job), header, body, ack=(self.channel, env.id))

    async def _serve(self, h: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        job = str(h.get("job") or "")
        entry = self.jobs.get(job)
        if entry is None:
            self.errors += 1
            return _reply(h, self.agent_id, FAILED,
                          error=f"agent {self.agent_id} holds no allocation of job {job!r}"), b""
        url = str(h.get("url") or "")
        headers = {str(k): str(v) for k, v in (h.get("headers") or {}).items()
                   if str(k).lower() not in _HOP_HEADERS}
        request = Request(url, method=str(h.get("method") or "GET"),
                          headers=headers or None, data=body or None)
        wait: RenderWait | None = None
        if h.get("render") is not None:
            try:
                # (the agent's render settings hold its default waits)
                wait = render_wait(h["render"], self.render_config, key="render")
            except ConfigError as exc:
                self.errors += 1
                return _reply(h, self.agent_id, FAILED, error=f"bad render request: {exc}"), b""
        entry.active += 1
        fetched: Fetched | None = None
        try:
            downloader = self._downloader(entry)
            slot = None
            gate: Any = self.gate
            if gate is not None:
                from crawlhub.agents.politeness.gate import domain_of

                slot = await gate.acquire(domain_of(url))
            try:
                if wait is not None:  # in the job's context of the agent's browser
                    if self.browser is None:
                        self.browser = BrowserDownloader(self.render_config)
                    entry.rendered = True
                    fetched = await self.browser.fetch(url, job=job, wait=wait,
                                                       http=downloader)
                else:
                    fetched = await downloader.fetch(request, job=job)
            finally:
                if slot is not None:
                    from crawlhub.agents.politeness.gate import retry_after_seconds

                    retry_after = None
                    if fetched is not None and fetched.status:
                        retry_after = retry_after_seconds(fetched.headers.get("Retry-After"),
                                                          time.time())
                    await gate.release(slot, fetched.status if fetched else None,
                                            retry_after)
        finally:
            entry.active -= 1
            entry.last_used = time.monotonic()
        self.pages += 1
        if not fetched.ok:
            self.errors += 1
        header = _reply(h, self.agent_id, OK, fetched=fetched)
        if entry.rules is not None and fetched.ok:
            rules: ExtractionRules = entry.rules.default
            try:
                if "extract" in h:
                    rules = entry.rules.for_task(h["extract"])
                got = rules.extract(fetched.body, fetched.final_url,
                                    depth=int(h.get("depth") or 0),
                                    content_type=fetched.content_type,
                                    headers=fetched.headers)
                header.update(fields=got.fields, links=got.links, title=got.title)
            except (ParseError, ConfigError) as exc:
                header.update(outcome="parse_error", error=str(exc))
        return header, (fetched.body if entry.body else b"")


def _window(h: dict[str, Any]) -> float:
    """An ``allocate``'s window, ``exp - ts`` (both the center's clock): how long it may
    wait for its acks, 0 to 3600 s; 0 when either is missing or not a number."""
    try:
        return max(0.0, min(float(h["exp"]) - float(h["ts"]), 3600.0))
    except (KeyError, TypeError, ValueError):
        return 0.0


async def _nap(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` or until ``stop`` is set."""
    await wait_until(stop.wait(), seconds)


def _reply(h: dict[str, Any], agent: str, status: str, *, fetched: Fetched | None = None,
           error: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "reply", "rid": h.get("rid"), "job": h.get("job"),
                           "attempt": h.get("attempt"), "status": status, "agent": agent,
                           "ts": time.time()}
    if fetched is not None:
        # str keys, not the response's istr: orjson refuses str subclasses as keys, and
        # every reply then fell back to the standard library's encoder (~10x slower)
        out.update(code=fetched.status, outcome=fetched.outcome, url=fetched.final_url,
                   headers={str(k): v for k, v in fetched.headers.items()},
                   elapsed=round(fetched.elapsed, 4),
                   error=fetched.error)
    elif error:
        out["error"] = error
    return out

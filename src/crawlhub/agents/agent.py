"""The downloader agent: lease URL tasks, fetch, extract, report results, ack.

Flow of one task: lease (in batches from one or more outbound queues) -> its extraction
rules (the agent's, or those its ``extract`` key names or holds; invalid ones are its
``parse_error``, 2005, and it is not fetched) -> robots.txt (optional: a disallowed URL is
not fetched, its result is ``robots_disallowed``, 2007, and it is acked like any other) ->
domain gate (optional) -> downloader (the browser, ``agents.browser``, for a task whose
``render``, whose rules' ``render`` or whose agent says so) -> extraction -> the page goes to ``on_pages`` (crawl
mode: links to the frontier, carrying the task's ``extract``, items to the sink) -> its
result ``{task_uuid, routed_count, task_result}`` goes to the hub -> ack. Pages are handled in *flushes* of up to
``flush_size``: one ``on_pages`` call, one report, one ack per queue, so a flush of 200
pages costs 3 backend round trips, not 600. A task is acked only after its result was
recorded: an agent killed at any point loses nothing (its leases expire, another agent or
its restart leases them again; a result reported twice is stale at the hub). While the
agent holds a task - buffered, in flight or waiting for its flush - it extends the lease:
every third of a lease, one ``extend`` per queue for every held task leased (or last
extended) more than a third of a lease ago, so a slow site never sees a task twice.
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crawlhub.agents.browser import BrowserDownloader, RenderConfig, RenderWait, render_wait
from crawlhub.agents.codes import (
    CONNECTION_ERROR,
    PARSE_ERROR,
    ROBOTS_DISALLOWED,
    SUCCESS,
    TIMEOUT,
    ResultCodes,
)
from crawlhub.agents.downloader import Downloader, Fetched
from crawlhub.agents.extract import Extracted, ExtractionRules, ParseError, RuleSets
from crawlhub.agents.politeness.robots import Refusal, origin_of
from crawlhub.agents.sitemaps import unchanged_since
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.errors import ConfigError
from crawlhub.core.jobprotocol import EXIT, PAUSE, RUN
from crawlhub.core.task import RESULT_KEY
from crawlhub.fetch.http import Request
from crawlhub.queues.base import Message, ReliableQueue

log = logging.getLogger("crawlhub.agents.agent")

#: Seconds a lease lasts. A held task's lease is extended every third of it, so this is how
#: long a killed agent's tasks wait before another agent takes them.
LEASE_SECONDS = 120.0
#: Seconds between two polls of empty queues.
IDLE_POLL = 0.05
#: Seconds before leasing again after a backend error.
LEASE_RETRY = 1.0
#: Seconds between two looks at the run's control (pause / continue / exit).
CONTROL_POLL = 0.1


@dataclass(slots=True)
class CrawledPage:
    """One task done: its leased message, the download and what was extracted."""

    queue: str
    message: Message
    fetched: Fetched
    extracted: Extracted | None
    code: int
    #: done before (``skip`` said so): reported as a success, not fetched
    skipped: bool = False
    #: not fetched because of robots.txt: why (its rules, or the file unavailable)
    refusal: Refusal | None = None
    #: a conditional recrawl found it unchanged (304, or the same body): not extracted
    unchanged: bool = False
    #: what the conditional recrawl keeps of its answer once it is flushed
    validators: Any = None

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


def link_tasks(links: Mapping[str, int], pages: Sequence[CrawledPage]) -> list[dict[str, Any]]:
    """The tasks for ``links`` (URL -> depth) found on ``pages``: ``{url, depth}``, and the
    ``extract`` of the page that found the link first when that page's task had one, so a
    crawl keeps the rules its seed asked for, and ``center_agent``, the download center's
    agent that downloaded that page (a chained crawl sends the link back to it). Costs
    one pass over the links of the flush only when one of its tasks carries ``extract``
    or one of its pages came through the download center. A link found on a page whose
    task says ``render`` carries that ``render`` on too."""
    if not any("extract" in p.task or "render" in p.task or p.fetched.agent for p in pages):
        return [{"url": u, "depth": d} for u, d in links.items()]
    first: dict[str, Any] = {}
    by: dict[str, str] = {}
    rendered: dict[str, Any] = {}
    for page in pages:
        if page.extracted is not None:
            spec = page.task.get("extract")
            render = page.task.get("render")
            for link in page.extracted.links:
                first.setdefault(link, spec)
                if render is not None:
                    rendered.setdefault(link, render)
                if page.fetched.agent:
                    by.setdefault(link, page.fetched.agent)
    tasks: list[dict[str, Any]] = []
    for url, depth in links.items():
        task: dict[str, Any] = {"url": url, "depth": depth}
        spec = first.get(url)
        if spec is not None:
            task["extract"] = spec
        if url in rendered:  # a rendered page's links are rendered too
            task["render"] = rendered[url]
        agent = by.get(url)
        if agent:  # the download center's agent that found it: chained, it goes back there
            task["center_agent"] = agent
        tasks.append(task)
    return tasks


Report = Callable[[list[dict[str, Any]]], Awaitable[Any]]
OnPages = Callable[[list[CrawledPage]], Awaitable[Any]]
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
        from crawlhub.backends import redis_client

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
    ``rules``: the extraction rules of tasks without an ``extract`` key, or a
    ``RuleSets`` that also knows named sets and compiles the inline ones tasks carry.
    ``clock`` (epoch seconds, :mod:`crawlhub.core.clock`) times the held leases; they are
    extended on real time, every third of ``lease_seconds``.
    ``gate`` is an optional ``DomainGate``; ``registry`` an optional ``AgentRegistry``.
    ``control`` (anything with ``state``: ``run`` / ``pause`` / ``exit``, e.g.
    ``crawlhub.sdk.control()``) is looked at every ``CONTROL_POLL`` s: paused, the agent
    leases nothing and starts no fetch (a task waiting for its domain's turn gives the
    turn back and waits for continue), the fetches in flight finish and are flushed and
    the tasks it holds keep their leases; then the pause is acknowledged (the control's
    ``acknowledge()``, when it has one: a job runner stops the processes of a job that
    does not acknowledge within a second); exit ends the run once those are flushed
    (``exited`` is then True; buffered tasks go back when their leases end).
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
        rules: ExtractionRules | RuleSets | None = None,
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
        clock: Clock = system_clock,
        control: Any | None = None,
        browser: BrowserDownloader | None = None,
        render: bool = False,
        render_config: RenderConfig | None = None,
        revalidate: Any | None = None,
        max_pages: int | None = None,
    ) -> None:
        if not queues:
            raise ValueError("an agent needs at least one queue to lease from")
        self.queues = queues
        self.downloader = downloader
        self.report = report
        self.rule_sets = rules if isinstance(rules, RuleSets) else RuleSets(rules)
        #: the rules of tasks without ``extract``
        self.rules = self.rule_sets.default
        self.codes = codes or ResultCodes()
        self.on_pages = on_pages
        self.concurrency = concurrency
        # two rounds of work: enough to keep every slot busy between leases, few enough
        # that buffered tasks do not wait long (their leases are renewed meanwhile, and
        # another agent could have fetched them)
        self.lease_batch = lease_batch or min(max(2 * concurrency, 16), 512)
        self.flush_size = flush_size
        self.flush_every = flush_every
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.gate = gate
        self.registry = registry
        self.robots = robots
        self.user_agent = downloader.config.user_agent
        #: a ``CenterDownloader``: fetches go through the download center
        self.remote = bool(getattr(downloader, "remote", False))
        self.heartbeat_every = heartbeat_every
        self.agent_id = agent_id or f"{socket.gethostname()}-{os.getpid()}"
        #: URLs among a leased batch already done (a resumed crawl's written items)
        self.skip = skip
        #: keep each page's body for ``on_pages`` (else dropped once extracted)
        self.keep_body = keep_body
        self.stats = AgentStats()
        self._ready: deque[tuple[str, Message]] = deque()
        #: receipt -> (queue, when leased or last extended) of every task leased and not
        #: yet acked (or given up by a failed flush): whose leases ``renew`` extends
        self._held: dict[str, tuple[str, float]] = {}
        self._outbox: list[CrawledPage] = []
        self._inflight = 0
        #: downloads going now (``_inflight`` also counts tasks waiting for their turn)
        self._fetching = 0
        self._flushing: asyncio.Task[None] | None = None
        #: set while the outbox has room: workers wait on it (memory stays bounded when
        #: fetching outruns flushing)
        self._room = asyncio.Event()
        self._room.set()
        self._wake = asyncio.Event()
        # the feeder's wake-ups: ``_low`` when ready work fell below one round of the
        # workers, ``_fed`` when a flush has submitted (links may now be queued)
        self._low = asyncio.Event()
        self._fed = asyncio.Event()
        self._started = time.monotonic()
        self.control = control
        #: conditional recrawl (``crawlhub.frontier.conditional.Revalidation``): validators
        #: read per leased batch, sent as If-None-Match / If-Modified-Since, unchanged
        #: pages not extracted, new validators written with each flush
        self.revalidate = None if self.remote else revalidate
        #: clear while the run's control says pause (or exit): no lease, no new fetch
        self._running = asyncio.Event()
        self._running.set()
        #: the control said exit: the run ended after flushing what was in flight
        self.exited = False
        #: renders the tasks that ask for it (``render`` in the task or its rules), and
        #: every task when ``render`` is true; made at the first such task when not given
        #: (then closed by ``run``): Playwright is imported only then
        self.browser = browser
        self._own_browser = False
        self.render = render
        self.render_config = render_config
        #: fetches this run may start (``crawlhub crawl --max-pages``): once they are
        #: done the run ends as on exit, what is still queued waits for the next run
        self.max_pages = max_pages
        self._taken = 0
        #: the run ended because ``max_pages`` were fetched
        self.limited = False

    # ------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event | None = None,
                  until_idle: Callable[[], Awaitable[bool]] | None = None) -> None:
        stop = stop or asyncio.Event()
        beat = asyncio.create_task(self._beat_forever(stop)) if self.registry else None
        workers = [asyncio.create_task(self._worker(stop)) for _ in range(self.concurrency)]
        flusher = asyncio.create_task(self._flush_forever(stop))
        renewer = asyncio.create_task(self._renew_forever(stop))
        follower = (asyncio.create_task(self._follow_control(stop))
                    if self.control is not None else None)
        try:
            await self._feed(stop, until_idle)
        finally:
            stop.set()
            self._wake.set()
            if follower is not None:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
            for w in workers:
                w.cancel()
            for w in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
            for task in (flusher, renewer):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # a flush under way ends before run() does: its caller closes the sink next
            # (cancelled, as by Ctrl-C, the flush would write into a closed sink)
            while (flushing := self._flushing) is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(flushing)
                if self._flushing is flushing and flushing.done():
                    break
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
            if self._own_browser and self.browser is not None:
                await self.browser.close()
            # What was leased and not done returns to ready when its lease ends.

    async def _feed(self, stop: asyncio.Event,
                    until_idle: Callable[[], Awaitable[bool]] | None) -> None:
        """Keep about two leases' worth of work buffered; end when told or idle."""
        names = list(self.queues)
        turn = 0
        low, fed = self._low, self._fed
        while not stop.is_set():
            if not self._running.is_set():  # paused, or exit asked
                if self.exited:
                    await self._settle()
                    return
                await asyncio.sleep(IDLE_POLL)
                continue
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
                    if messages:
                        now = self.clock()
                        held = self._held
                        for m in messages:
                            held[m.receipt] = (name, now)
                    if messages and self.skip is not None:
                        messages = await self._skip_done(name, messages)
                    if messages and self.revalidate is not None:
                        await self.revalidate.prepare(
                            [str(m.payload.get("url") or "") for m in messages])
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
                # the queues are empty for now: their next work comes from a flush (the
                # links of the pages done), or from elsewhere within a poll
                fed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fed.wait(), IDLE_POLL)
                continue
            # enough work ready: lease again as soon as the workers have taken a round
            # of it (a fixed poll here starved 64 workers at 2,000 pages/s)
            low.clear()
            if len(self._ready) >= self.concurrency:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(low.wait(), IDLE_POLL)

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
                self._outbox.append(CrawledPage(name, m, fetched, None, self.codes.success,
                                         skipped=True))
            else:
                keep.append(m)
        return keep

    async def _worker(self, stop: asyncio.Event) -> None:
        ready = self._ready
        running = self._running
        concurrency = self.concurrency
        while not stop.is_set():
            if not running.is_set():
                await running.wait()
                continue
            if not ready:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.max_pages is not None and self._taken >= self.max_pages:
                # the budget is spent: a fetch in flight may still give one back (robots)
                if not self._inflight:
                    self.limited = self.exited = True
                    running.clear()
                await asyncio.sleep(IDLE_POLL)
                continue
            name, message = ready.popleft()
            if len(ready) < concurrency:
                self._low.set()
            self._inflight += 1
            self._taken += 1
            try:
                page = await self._do(name, message)
            finally:
                self._inflight -= 1
            if page.refusal is not None or page.fetched.outcome == ROBOTS_DISALLOWED:
                self._taken -= 1  # not fetched: no page of the budget
            if not self.keep_body:
                page.fetched.body = b""
            self._outbox.append(page)
            if len(self._outbox) >= self.flush_size or (not ready and not self._inflight):
                # a full batch, or the last page in hand (its links are the next work)
                if self._flushing is None:
                    self._start_flush()
                elif len(self._outbox) >= 2 * self.flush_size:
                    self._room.clear()
                    await self._room.wait()

    async def _do(self, name: str, message: Message) -> CrawledPage:
        task = message.payload
        url = str(task.get("url") or "")
        rules = self.rules
        if "extract" in task:
            try:
                rules = self.rule_sets.for_task(task["extract"])
            except ConfigError as exc:
                return self._bad_rules(name, message, url, exc)
        wait: RenderWait | None = None
        if self.render or "render" in task or rules.render is not None:
            try:
                wait = self._render_wait(task, rules)
            except ConfigError as exc:
                return self._bad_rules(name, message, url, exc)
        revalidate = self.revalidate
        if (revalidate is not None and "lastmod" in task
                and unchanged_since(task, revalidate.fetched_at(url))):
            # the sitemap says the page did not change since its kept answer: not
            # fetched at all, no item (its validators stay as they were)
            revalidate.skip(url)
            kept = Fetched(url, url, 0, {}, b"", 0.0, None, SUCCESS, attempts=0)
            return CrawledPage(name, message, kept, None, self.codes.success, unchanged=True)
        if self.robots is not None:
            refusal = await self._robots_refusal(url)
            if refusal is not None:
                if self.revalidate is not None:
                    self.revalidate.forget(url)
                refused = Fetched(url, url, 0, {}, b"", 0.0, None, ROBOTS_DISALLOWED,
                                  attempts=0, error=str(refusal))
                return CrawledPage(name, message, refused, None, self.codes.code(ROBOTS_DISALLOWED),
                            refusal=refusal)
        slot = None
        gate: Any = self.gate
        if gate is not None:
            from crawlhub.agents.politeness.gate import domain_of

            slot = await gate.acquire(domain_of(url))
            # paused while waiting for the domain's turn: give the turn back, fetch
            # nothing until continued (with a delay, the turns of every task already
            # leased would otherwise go on for seconds after the pause)
            while not self._running.is_set() and not self.exited:
                await gate.release(slot)
                while not self._running.is_set() and not self.exited:
                    await asyncio.sleep(CONTROL_POLL)
                slot = await gate.acquire(domain_of(url))
        status: int | None = None
        fetched: Fetched | None = None
        self._fetching += 1
        try:
            if self.remote:  # the download center's: it needs the task (chain, depth, rules)
                remote: Any = self.downloader
                # with ``wait``, rendered by the center's agent in its browser
                fetched = await remote.fetch(url, job=str(task.get("job") or ""), task=task,
                                             render=wait)
            elif wait is not None:
                fetched = await self._browser().fetch(url, job=str(task.get("job") or ""),
                                                      wait=wait)
            else:
                conditional = self.revalidate.headers(url) if self.revalidate else None
                fetched = await self.downloader.fetch(
                    Request(url, headers=conditional) if conditional else url,
                    job=str(task.get("job") or ""))
            status = fetched.status or None
        finally:
            self._fetching -= 1
            if slot is not None and gate is not None:
                from crawlhub.agents.politeness.gate import retry_after_seconds

                retry_after = None
                if fetched is not None and status:
                    retry_after = retry_after_seconds(fetched.headers.get("Retry-After"),
                                                      time.time())
                # the answer's latency and failure feed adaptive domains (ignored else)
                failed = fetched is not None and fetched.outcome in (TIMEOUT, CONNECTION_ERROR)
                await gate.release(slot, status, retry_after,
                                   latency=None if fetched is None else fetched.elapsed,
                                   failed=failed)
        extracted: Extracted | None = None
        code = self.codes.code(fetched.outcome, fetched.status)
        validators = None
        if self.revalidate is not None:
            unchanged, validators = self.revalidate.settle(url, fetched.status,
                                                           fetched.headers, fetched.body)
            if unchanged:
                return CrawledPage(name, message, fetched, None, self.codes.success,
                                   unchanged=True, validators=validators)
        if fetched.extracted is not None:  # the center's agent extracted it
            extracted = fetched.extracted
        elif fetched.ok:
            try:
                extracted = rules.extract(fetched.body, fetched.final_url,
                                               depth=int(task.get("depth") or 0),
                                               content_type=fetched.content_type,
                                               headers=fetched.headers)
            except ParseError as exc:
                fetched.outcome, fetched.error = PARSE_ERROR, str(exc)
                code = self.codes.code(PARSE_ERROR, fetched.status)
        return CrawledPage(name, message, fetched, extracted, code, validators=validators)

    def _render_wait(self, task: Mapping[str, Any], rules: ExtractionRules) -> RenderWait | None:
        """How the task's page is rendered, or None (downloaded over HTTP): the task's
        ``render``, else its rules' ``render``, else the agent's."""
        default = (self.browser.default_wait if self.browser is not None
                   else RenderWait.model_validate(self.render_config.model_dump(
                       include={"wait_until", "wait_for"})) if self.render_config is not None
                   else RenderWait())
        spec = task.get("render")
        if spec is not None:
            return render_wait(spec, default, key="render")
        if rules.render is not None:
            return render_wait(rules.render, default, key="extract.render")
        return default if self.render else None

    def _browser(self) -> BrowserDownloader:
        if self.browser is None:
            self.browser = BrowserDownloader(self.render_config, cookies=self.downloader)
            self._own_browser = True
        return self.browser

    def _bad_rules(self, name: str, message: Message, url: str, exc: ConfigError) -> CrawledPage:
        """A task whose ``extract`` cannot be used: not fetched, its result the parse
        error code, the reason logged with the task and the key."""
        log.warning("agent %s: task %s (%s): its extraction rules are invalid at key '%s':"
                    " %s; reported as a parse error, not fetched", self.agent_id,
                    message.payload.get("task_uuid") or message.id, url, exc.key or "extract",
                    exc.reason)
        refused = Fetched(url, url, 0, {}, b"", 0.0, None, PARSE_ERROR, attempts=0,
                          error=f"invalid extraction rules: {exc}")
        return CrawledPage(name, message, refused, None, self.codes.code(PARSE_ERROR))

    async def _robots_refusal(self, url: str) -> Refusal | None:
        """Why robots.txt keeps this agent from ``url`` (None: it may fetch it)."""
        robots: Any = self.robots
        try:
            if hasattr(robots, "refusal"):
                return await robots.refusal(url, self.user_agent)  # type: ignore[no-any-return]
            if await robots.allowed(url, self.user_agent):
                return None
        except ValueError:
            return None  # not an absolute http(s) URL: the downloader reports it
        return Refusal(origin_of(url), 200)

    # ------------------------------------------------------------------ control
    async def _follow_control(self, stop: asyncio.Event) -> None:
        """Apply the run's control: one look (a memory read, a ``stat`` at most) a poll."""
        control: Any = self.control
        running = self._running
        acknowledge = getattr(control, "acknowledge", None)
        while not stop.is_set():
            state = control.state
            if state == EXIT:
                log.info("agent %s: exit requested; finishing the %d fetches in flight",
                         self.agent_id, self._inflight)
                self.exited = True
                running.clear()
                return
            if state == PAUSE and running.is_set():
                log.info("agent %s: paused; %d fetches in flight finish, no new ones",
                         self.agent_id, self._inflight)
                running.clear()
            elif state == RUN and not running.is_set():
                log.info("agent %s: continued", self.agent_id)
                running.set()
            if (state == PAUSE and acknowledge is not None and not self._fetching
                    and not self._outbox and self._flushing is None):
                acknowledge()  # nothing in flight, all written: holding still (once)
            await asyncio.sleep(CONTROL_POLL)

    async def _settle(self) -> None:
        """Wait for the fetches in flight, then for every page done to be flushed (the
        flusher takes the outbox within ``flush_every``)."""
        while self._inflight or self._outbox or self._flushing is not None:
            await asyncio.sleep(IDLE_POLL)

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

    async def _flush(self, pages: list[CrawledPage]) -> None:
        """on_pages, report, ack: one call each for the whole flush. A failure leaves
        the tasks leased: they come back when their leases end."""
        try:
            if self.on_pages is not None:
                await self.on_pages(pages)
            if self.revalidate is not None:  # after the items: a kill between refetches
                await self.revalidate.remember([p.validators for p in pages])
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
            # acked, or left to expire after a failed flush: held no more either way
            held = self._held
            for p in pages:
                held.pop(p.message.receipt, None)
            self._flushing = None
            self._fed.set()
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

    # ------------------------------------------------------------------ leases
    async def renew(self) -> int:
        """Extend, to a full lease from now, the lease of every task this agent holds
        that was leased or last extended more than a third of a lease ago. Cost: one
        ``extend`` round trip per queue, whatever the number of tasks. Returns how many
        leases the queues extended (a lease already lost to another agent is not)."""
        now = self.clock()
        due = now - self.lease_seconds / 3
        by_queue: dict[str, list[str]] = {}
        for receipt, (name, since) in self._held.items():
            if since <= due:
                by_queue.setdefault(name, []).append(receipt)
        extended = 0
        for name, receipts in by_queue.items():
            try:
                extended += await self.queues[name].extend(receipts, self.lease_seconds)
            except Exception as exc:  # noqa: BLE001 - the backend is out: next round
                log.warning("agent %s: extending %d leases on %s failed (%s); trying again"
                            " in %.1f s", self.agent_id, len(receipts), name, exc,
                            self.lease_seconds / 3)
                continue
            held = self._held
            for receipt in receipts:
                if receipt in held:  # not acked while the extend was on the wire
                    held[receipt] = (name, now)
        return extended

    async def _renew_forever(self, stop: asyncio.Event) -> None:
        # real time, not the clock: a renewal is what a killed agent stops doing
        every = self.lease_seconds / 3
        while not stop.is_set():
            await asyncio.sleep(every)
            if self._held:
                await self.renew()

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

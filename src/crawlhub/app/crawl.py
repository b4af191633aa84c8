"""The one-process crawl: hub + frontier + agent + JSON lines writer on embedded SQLite.

Everything lives in the data dir (queue, hub ledger, frontier, the items file's index), so
the same command on the same data dir continues a killed run: the killed run's leases are
taken back at start (the data dir is locked to one crawl), and so are what its hub left
undone (links recorded and not pushed yet, retries settled and not pushed) and its
robots.txt fetches; the frontier remembers what was admitted, and a leased page whose URL
the items file already holds is reported done without being fetched again.

Cost per flush of ~200 pages: one lookup of the leased URLs in the items index, one
frontier-gated ``Hub.submit`` of the links not seen lately (links the frontier admitted
already are answered after two reads; new ones are recorded, admitted, pushed and marked:
4 SQLite transactions), one sink batch (1 append + 1 index commit), the results through
``Hub.receive`` (one ledger read and one settle transaction for the whole flush) and one
ack. 20,000 pages of the bench site: ~0.3 ms of CPU a page; 200,000: ~0.6 ms.

A ``--recrawl`` revalidates the last segment's archive first, outside that path
(:mod:`crawlhub.app.recrawl`: per 1,000 URLs one archive read, one validators read and
write, one admission; a 304 is no task), then the agent does what is left in the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crawlhub import sdk
from crawlhub.agents.agent import Agent, CrawledPage, HubReport, link_tasks
from crawlhub.agents.codes import CONNECTION_ERROR, ROBOTS_DISALLOWED, ResultCodes
from crawlhub.agents.downloader import Downloader, DownloaderConfig
from crawlhub.agents.extract import ExtractionRules
from crawlhub.agents.politeness.robots import Refusal
from crawlhub.agents.sitemaps import SitemapReport
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core.errors import CrawlhubError
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.frontier.sqlite import SqliteSeedStore
from crawlhub.queues.base import Message
from crawlhub.services import Services
from crawlhub.sinks.config import JsonlSinkConfig
from crawlhub.sinks.jsonl import JsonlSink

QUEUE = "crawl"
#: Result codes a crawl does not retry: the page is gone, unparsable or not allowed.
DONT_RETRY = [404, 410, 2005, 2007, 2008]
#: A frontier segment no crawl outlives: a URL is admitted once per data dir.
FOREVER = "36500d"
#: The data dir's file of recrawl segments (``--recrawl``): the run's segment, the one
#: before it and whether the run ended.
RECRAWL_FILE = "recrawl.json"
#: Seeds of the last segment a recrawl reads and revalidates at once (the fast path's
#: batch: one archive read, one validators read and write, one admission).
RECRAWL_BATCH = 1000
#: Links remembered in memory as already sent to the frontier (two generations of this
#: many): on a typical site each URL is linked ~10 times, and the frontier (canonical key,
#: bloom, SQLite) is the cost of a link; the bound keeps memory flat as the site grows.
SEEN_LINKS = 25_000


class Seen:
    """A bounded memory of links already submitted: two generations, the older dropped
    when the newer fills. A link it forgot goes to the frontier again, which dedups it."""

    def __init__(self, size: int = SEEN_LINKS) -> None:
        self.size = size
        self.new: set[str] = set()
        self.old: set[str] = set()

    def fresh(self, urls: dict[str, int]) -> dict[str, int]:
        """The links of ``urls`` not submitted lately (remembers nothing: see ``add``)."""
        new, old = self.new, self.old
        return {u: d for u, d in urls.items() if u not in new and u not in old}

    def add(self, urls: Iterable[str]) -> None:
        """Remember ``urls`` as submitted: call it once the submit returned. Links of a
        submit that failed (its backend down) are not remembered, so the page's next fetch
        (its lease runs out, it is fetched again) submits them again."""
        new = self.new
        new.update(urls)
        if len(new) >= self.size:
            self.old, self.new = new, set()

    async def submit(self, hub: Any, links: dict[str, int], pages: Sequence[CrawledPage],
                     known: Callable[[list[str]], Awaitable[set[str]]] | None = None) -> int:
        """Submit the links of ``pages`` not submitted lately through ``hub`` (each with
        its page's depth + 1 and ``extract``), then remember them; how many went.
        ``known``: which of them are taken care of otherwise (remembered, not sent)."""
        fresh = self.fresh(links)
        if fresh and known is not None:
            elsewhere = await known(list(fresh))
            if elsewhere:
                fresh = {u: d for u, d in fresh.items() if u not in elsewhere}
                self.add(elsewhere)
        if fresh:
            await hub.submit(link_tasks(fresh, pages), wait=True)
            self.add(fresh)
        return len(fresh)


@dataclass
class CrawlOptions:
    urls: list[str]
    out: Path
    data_dir: Path
    follow: bool = False
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    depth: int | None = None
    concurrency: int = 64
    per_domain: int = 0
    delay: float = 0.0
    #: adaptive politeness: each domain's concurrency climbs to ``per_domain`` (else
    #: ``concurrency``) while its server keeps up, and falls back, with a rising delay,
    #: when it slows down or answers 429 / 503 (agents.politeness.adaptive)
    adaptive: bool = False
    #: recrawl: a new frontier segment for this run (``recrawl.json`` in the data dir
    #: counts them), every URL of the last one admitted again and fetched conditionally
    #: (If-None-Match / If-Modified-Since); a 304 or an unchanged body is no item
    recrawl: bool = False
    #: with recrawl: extract and write pages whose body is unchanged too (a 304 still not)
    emit_unchanged: bool = False
    extract: dict[str, Any] | None = None
    retries: int = 2
    timeout: float = 30.0
    #: honour robots.txt: a disallowed URL is not fetched (result 2007, counted in
    #: ``CrawlProgress.robots``); its rules cached in the data dir's politeness.db
    robots: bool = True
    #: a sink mapping (``crawlhub collect``'s ``sink:``) to write items to instead of
    #: ``out``; keyed by ``url`` unless it says otherwise
    sink: dict[str, Any] | None = None
    #: the User-Agent of every request, robots.txt's included (None: the downloader's)
    user_agent: str | None = None
    #: the download center's broker (``redis://...``, ``memory://...``): downloads go
    #: through its agents, allocated by ``strategy`` (``agents`` of them)
    center: str | None = None
    strategy: str = "random"
    agents: int = 1
    center_prefix: str = DEFAULT_PREFIX
    #: seconds to wait for the center's allocation
    allocate_timeout: float = 10.0
    #: seed from the sites' sitemaps too (robots.txt ``Sitemap:`` lines, else
    #: ``/sitemap.xml``; a start URL that is a sitemap is read, not fetched as a page);
    #: ``sitemaps_only``: crawl just the sitemaps' URLs (no start page, no links followed)
    sitemaps: bool = False
    sitemaps_only: bool = False
    #: pages this run fetches at most (then it stops as on exit: the same command resumes)
    max_pages: int | None = None
    #: a page's ``<link rel=canonical>`` (same host) is the URL its item is written under
    canonical: bool = True
    #: pause / continue / exit (anything with ``state``, e.g. ``crawlhub.sdk.Manual()``);
    #: None: the runner's control file when a runner started this process
    #: (``crawlhub.sdk.control()``), else none
    control: Any | None = None
    #: render every page in headless Chromium (``agents.browser``): links and fields are
    #: taken from the DOM its scripts built; ``render_concurrency`` pages at once, each
    #: waited for until ``wait_until``, then for the CSS selector ``wait_for`` when given
    render: bool = False
    render_concurrency: int = 4
    wait_until: str = "load"
    wait_for: str | None = None


@dataclass
class CrawlProgress:
    pages: int = 0
    items: int = 0
    errors: int = 0
    skipped: int = 0
    #: URLs not fetched because robots.txt's rules disallow them (not pages, not errors)
    robots: int = 0
    #: URLs not fetched because their site's robots.txt could not be had (no answer, or
    #: 5xx: RFC 9309 disallows everything then), and why, by origin
    robots_unavailable: int = 0
    robots_failures: dict[str, Refusal] = field(default_factory=dict)
    #: start URLs whose server could not be reached (no answer to the page or to its
    #: robots.txt), and why: ``crawlhub crawl`` exits 1 naming them
    unreachable: dict[str, str] = field(default_factory=dict)
    links: int = 0
    queued: int = 0
    #: pages a conditional recrawl found unchanged (304, or the same body): no item
    unchanged: int = 0
    #: of those, answered 304 Not Modified (nothing downloaded)
    not_modified: int = 0
    #: the run's control said exit: stopped after flushing what was in flight (resumable)
    exited: bool = False
    #: pages fetched whose ``<meta name=robots>`` / ``X-Robots-Tag`` said noindex (no item)
    noindex: int = 0
    #: the run stopped at ``max_pages``
    limited: bool = False
    #: what reading the sitemaps came to (None: not asked, or read by an earlier run)
    sitemaps: SitemapReport | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        return self.pages / max(time.monotonic() - self.started, 1e-6)


def crawl_config(opts: CrawlOptions) -> CrawlhubConfig:
    return CrawlhubConfig.model_validate({
        "project": "crawl",
        "data_dir": str(opts.data_dir),
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": QUEUE, "class": "queue", "frontier": QUEUE,
                      "init": {"key": QUEUE}, "retry_limits": opts.retries,
                      "dont_retry_status": DONT_RETRY}],
        "frontier": {QUEUE: {"segment": FOREVER, "exact": True}},
    })


def _lock(data_dir: Path) -> Any:
    """Hold the data dir for this crawl alone (released when the process ends)."""
    import fcntl

    f = (data_dir / "crawl.lock").open("a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise CrawlhubError(f"another crawl is running on the data dir {str(data_dir)!r};"
                            " wait for it to end or give another --data-dir") from None
    return f


#: KiB of SQLite page cache for the crawl's frontier (the frontier's default, 64 MB, is
#: for long-lived hubs with many segments; a crawl's keys are read back rarely and the
#: OS caches the file anyway): keeps a crawl's RSS flat as the site grows.
FRONTIER_CACHE_KIB = 4096
#: KiB of SQLite page cache for each of the crawl's other files (hub ledger, queue, the
#: sink's index): SQLite's default is 2 MB each.
CACHE_KIB = 512


class Crawl:
    """One crawl; ``await Crawl(opts).run(on_progress)`` returns its :class:`CrawlProgress`."""

    def __init__(self, opts: CrawlOptions) -> None:
        self.opts = opts
        extract = dict(opts.extract or {})
        links = dict(extract.get("links") or {})
        links.setdefault("follow", opts.follow)
        if opts.sitemaps_only:
            links["follow"] = False
        if opts.allow:
            links["allow"] = list(links.get("allow") or []) + opts.allow
        if opts.deny:
            links["deny"] = list(links.get("deny") or []) + opts.deny
        if opts.depth is not None:
            links["max_depth"] = opts.depth
        extract["links"] = links
        if not opts.canonical:
            extract["page"] = {**dict(extract.get("page") or {}), "canonical": False}
        self.extract = extract
        self.rules = ExtractionRules.from_config(extract)
        self.codes = ResultCodes()
        self.progress = CrawlProgress()
        self.starts = set(opts.urls)
        self.seen = Seen()
        #: a recrawl's segment, and the segment it revalidates (None: not a recrawl)
        self._segment = 0
        self._previous: int | None = None
        self.services: Services | None = None
        self.sink: Any = None
        #: where items go, for the summary: the --out file or the sink's type
        self.sink_name = str(opts.out) if opts.sink is None else \
            f"the {opts.sink.get('type', 'jsonl')} sink"

    async def run(self, on_progress: Callable[[CrawlProgress], None] | None = None) -> CrawlProgress:
        opts = self.opts
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        lock = _lock(opts.data_dir)
        # (no control plane: a crawl runs no jobs, builds or alerts - start-up)
        services = self.services = await Services.open(crawl_config(opts), control=False)
        try:
            self.sink = self._sink(services)
            await self.sink.open()
        except BaseException:
            await services.close()
            lock.close()
            raise
        gate = None
        browser = None
        stop = asyncio.Event()
        try:
            downloader = await self._open_downloader(stop)
            # launched now: a missing browser is the crawl's error at once (with --center
            # the center's agents render, in their own browsers)
            if opts.render and opts.center is None:
                browser = await self._open_browser(downloader)
        except BaseException:
            if browser is not None:
                await browser.close()
            await self.sink.close()
            await services.close()
            lock.close()
            raise
        try:
            # through the center, the agents keep their own per-domain limits
            limits = bool(opts.per_domain or opts.delay or opts.adaptive) \
                and opts.center is None
            if limits or opts.robots:
                gate = self._gate(downloader.config.user_agent)
                await gate.reset()  # the lock is ours: a killed run's slots are free now
            hub = services.hub
            queue = services.queues.queue(QUEUE)
            # the lock says a killed run is dead: its leases need not wait out their timeout,
            # nor the tasks it recorded and did not push, nor its results' follow-ups
            await queue.requeue_leased()
            await hub.take_over()
            # and the hub's own loops: heartbeat, recovery of what an outage left undone,
            # the sweep of follow-ups (stopped by services.close)
            await hub.start()
            store = services.frontiers[QUEUE].store
            if isinstance(store, SqliteSeedStore):  # (the data dir's frontier.db)
                await store.set_cache_kib(FRONTIER_CACHE_KIB)
            # the ledger, the queue and the sink's index: SQLite's 2 MB each fill as the
            # site grows; what a crawl reads back is recent (the OS caches the rest)
            for db in (hub.state, services.queues, self.sink):
                bound = getattr(db, "set_cache_kib", None)
                if bound is not None:
                    await bound(CACHE_KIB)
            # every answer's validators are kept, so a later --recrawl can ask conditionally
            recrawling = opts.recrawl or (opts.data_dir / RECRAWL_FILE).exists()
            left = await self._recrawl(services) if recrawling else None
            from crawlhub.frontier.conditional import Revalidation

            revalidate = None if opts.center is not None else Revalidation(
                services.frontiers[QUEUE], skip_unchanged=not opts.emit_unchanged)
            starts = opts.urls
            if opts.sitemaps or opts.sitemaps_only:
                await self._seed_sitemaps(hub)
                from crawlhub.agents.sitemaps import looks_like_sitemap

                starts = [] if opts.sitemaps_only else [
                    u for u in opts.urls if not looks_like_sitemap(u)]
            await hub.submit([{"url": u, "depth": 0} for u in starts], wait=True)
            control = opts.control
            if control is None and sdk.under_runner():
                control = sdk.control()
            ticker = asyncio.create_task(self._tick(queue, on_progress))
            try:
                budget = opts.max_pages
                fast = None
                if left is not None and revalidate is not None:
                    # the archive first, on the fast path; the agent then does the rest
                    # (start and sitemap URLs, new links, what the pass handed over)
                    fast = await self._revalidate_archive(
                        left, revalidate, downloader, gate if limits else None,
                        gate if opts.robots else None, control)
                    if budget is not None:
                        budget = max(budget - fast.taken, 0)
                agent = Agent({QUEUE: queue}, downloader, report=HubReport(hub, "http"),
                              rules=self.rules, codes=self.codes, on_pages=self._on_pages,
                              concurrency=opts.concurrency, gate=gate if limits else None,
                              robots=gate if opts.robots else None,
                              skip=None if recrawling else self._written,
                              control=control, browser=browser, render=opts.render,
                              render_config=self._render_config() if opts.render else None,
                              revalidate=revalidate, max_pages=budget)
                self.agent = agent

                async def idle() -> bool:
                    if await queue.length():
                        return False
                    # the hub may hold retries it has not pushed yet
                    return not await hub.state.pending()

                if fast is not None and (fast.exited or fast.limited):
                    agent.exited, agent.limited = True, fast.limited
                else:
                    await agent.run(stop, until_idle=idle)
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            fatal = getattr(downloader, "fatal", None)
            if fatal is not None:
                await agent.drain()
                raise fatal
            self.progress.limited = agent.limited
            self.progress.exited = agent.exited and not agent.limited
            if recrawling and not agent.exited:
                self._recrawl_done()
            if not agent.exited:
                self.progress.queued = 0
            if on_progress is not None:
                on_progress(self.progress)
            return self.progress
        finally:
            self._count(flush=True)
            if browser is not None:
                await browser.close()
            await downloader.close()
            if gate is not None:
                with contextlib.suppress(Exception):
                    await gate.close()
            await self.sink.close()
            await services.close()
            lock.close()

    async def _revalidate_archive(self, left: tuple[int, str], revalidate: Any,
                                  downloader: Any, gate: Any, robots: Any,
                                  control: Any) -> Any:
        """Run the fast path over what is left of the last segment's archive; the pass
        (its ``taken``, ``exited``, ``limited``) once it ended."""
        from crawlhub.app.recrawl import RecrawlPass

        assert self.services is not None
        hub = self.services.hub

        async def submit(tasks: list[dict[str, Any]]) -> None:
            await hub.submit(tasks, wait=True)

        previous, cursor = left
        fast = RecrawlPass(self.services.frontiers[QUEUE], previous, revalidate,
                           downloader=downloader, rules=self.rules, codes=self.codes,
                           on_pages=self._on_pages, submit=submit, save=self._save_cursor,
                           final={s for s in DONT_RETRY if s < 1000},
                           concurrency=self.opts.concurrency, gate=gate, robots=robots,
                           control=control, max_pages=self.opts.max_pages,
                           progress=self.progress, batch=RECRAWL_BATCH)
        await fast.run(cursor)
        return fast

    async def _seed_sitemaps(self, hub: Any) -> None:
        """Submit the URLs of the start URLs' sitemaps, a batch at a time as they are
        read (each task carrying its ``lastmod``, epoch seconds, when the sitemap gives
        one: a recrawl's agent fetches no page whose ``lastmod`` is not after its kept
        answer). Done once per data dir, and once per recrawl segment: a resumed crawl's
        frontier has them already."""
        from crawlhub.agents.sitemaps import http_chunks, read_sitemaps, sources

        # a recrawl reads them again (their lastmods are new): once per segment
        done = self.opts.data_dir / ("sitemaps.done" if self._previous is None
                                     else f"sitemaps-{self._segment}.done")
        if done.exists():
            return
        opts = self.opts
        user_agent = self._downloader_config().user_agent
        report = self.progress.sitemaps = SitemapReport()
        found = await sources(opts.urls, user_agent)
        async for batch in read_sitemaps(found, fetch=http_chunks(user_agent,
                                                                  timeout=opts.timeout),
                                         sites=opts.urls, admit=self.rules.admits,
                                         report=report):
            tasks: list[dict[str, Any]] = []
            for entry in batch:
                task: dict[str, Any] = {"url": entry.url, "depth": 0}
                if entry.lastmod is not None:
                    task["lastmod"] = entry.lastmod
                tasks.append(task)
            await hub.submit(tasks, wait=True)
        done.write_text(f"{report.urls} URLs from {report.sitemaps} sitemaps\n")

    def _sink(self, services: Services) -> Any:
        """The --out JSON lines file (its index says what is written: a resumed crawl
        fetches none of it again), or the --sink (keyed by url: a page fetched again after
        a kill is written once)."""
        if self.opts.sink is None:
            return JsonlSink(JsonlSinkConfig(path=self.opts.out, key=["url"]), name="items")
        from crawlhub.sinks.config import build_sink

        spec = {"key": ["url"], **self.opts.sink}
        return build_sink(spec, config=services.config.settings, name="items", entry="--sink")

    async def _open_downloader(self, stop: asyncio.Event) -> Any:
        """The crawl's downloader; with ``center``, a ``CenterDownloader`` whose agents
        were allocated (a refusal is the crawl's error, before anything is fetched): they
        extract with the crawl's rules and send back no bodies."""
        opts = self.opts
        config = self._downloader_config()
        if opts.center is None:
            return Downloader(config)
        from crawlhub.center import CenterClient, open_bus
        from crawlhub.center.downloader import CenterDownloader
        from crawlhub.core.signing import signer_from_config

        signer = (signer_from_config(self.services.config)
                  if self.services is not None else None)
        bus = open_bus(opts.center, prefix=opts.center_prefix, signer=signer)
        options: dict[str, Any] = {"extract": self.extract, "body": False,
                                   "downloader": {"timeout": opts.timeout}}
        if opts.user_agent:
            options["downloader"]["headers"] = {"User-Agent": opts.user_agent}
        job = f"crawl-{uuid.uuid4().hex[:12]}"
        # the reply timeout covers the agent's own request timeout and the center's hops
        client = CenterClient(bus, job, strategy=opts.strategy, agents=opts.agents,
                              options=options, allocate_timeout=opts.allocate_timeout,
                              timeout=opts.timeout + 10.0)
        try:
            await client.open()
        except BaseException:
            await bus.close()
            raise

        def fatal(_: Exception) -> None:
            stop.set()

        return CenterDownloader(client, config, on_fatal=fatal, close_bus=True)

    def _render_config(self) -> Any:
        """``--render``'s settings (concurrency, timeout, waits)."""
        from crawlhub.agents.browser import RenderConfig

        opts = self.opts
        return RenderConfig.from_config(
            {"concurrency": opts.render_concurrency, "timeout": opts.timeout,
             "wait_until": opts.wait_until, "wait_for": opts.wait_for}, key="--render")

    async def _open_browser(self, downloader: Any) -> Any:
        """The browser downloader of ``--render``, its Chromium started (sharing the HTTP
        downloader's cookie jars)."""
        from crawlhub.agents.browser import BrowserDownloader

        browser = BrowserDownloader(self._render_config(), cookies=downloader)
        try:
            await browser.start()
        except BaseException:
            await browser.close()
            raise
        return browser

    def _downloader_config(self) -> DownloaderConfig:
        opts = self.opts
        config = DownloaderConfig(concurrency=max(opts.concurrency, 1), timeout=opts.timeout)
        if opts.user_agent:
            config.headers = {**config.headers, "User-Agent": opts.user_agent}
        return config

    async def _recrawl(self, services: Services) -> tuple[int, str] | None:
        """Put the frontier in this run's segment (``recrawl.json``): with ``recrawl``
        after a run that ended, the next one. Returns what the fast path
        (:mod:`crawlhub.app.recrawl`) has left to revalidate of the last segment: its
        number and the archive cursor (None: nothing, or every URL of it was submitted
        as a task again - through the download center or with rendering, which the
        agent does)."""
        import json

        from crawlhub.frontier.segments import FixedSegment

        frontier = services.frontiers[QUEUE]
        path = self.opts.data_dir / RECRAWL_FILE
        state = json.loads(path.read_text()) if path.exists() else \
            {"segment": frontier.current_segment(), "done": True}
        if self.opts.recrawl and state["done"]:
            state = {"segment": int(state["segment"]) + 1, "previous": int(state["segment"]),
                     "done": False, "cursor": ""}
            self._write_recrawl(state)
        frontier.segments = FixedSegment(int(state["segment"]))
        self._segment = int(state["segment"])
        if state["done"] or "previous" not in state:
            return None
        previous = int(state["previous"])
        # links to a URL of the last segment are the pass's to revalidate, not new ones
        self._previous = previous
        if self._fast_recrawl():
            return None if state.get("passed") else (previous, str(state.get("cursor") or ""))
        cursor, hub = "", services.hub
        while True:
            cursor, seeds = await frontier.store.archived(previous, cursor, RECRAWL_BATCH)
            if seeds:
                await hub.submit([{"url": s.url, "depth": 0} for s in seeds], wait=True)
            if not cursor:
                return None

    def _fast_recrawl(self) -> bool:
        """Whether the archive is revalidated by the fast path (else as tasks): not
        through the download center, not rendered."""
        return self.opts.center is None and not self.opts.render and self.rules.render is None

    def _write_recrawl(self, state: dict[str, Any]) -> None:
        import json

        path = self.opts.data_dir / RECRAWL_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)

    def _save_cursor(self, cursor: str) -> None:
        """The fast path settled the archive up to ``cursor`` ("": all of it)."""
        import json

        path = self.opts.data_dir / RECRAWL_FILE
        state = json.loads(path.read_text())
        state["cursor"] = cursor
        if not cursor:
            state["passed"] = True
        self._write_recrawl(state)

    def _recrawl_done(self) -> None:
        import json

        path = self.opts.data_dir / RECRAWL_FILE
        if path.exists():
            state = json.loads(path.read_text())
            state["done"] = True
            path.write_text(json.dumps(state))

    def _gate(self, user_agent: str) -> Any:
        from crawlhub.agents.politeness import DomainRules, open_gate

        rules = DomainRules(concurrency=self.opts.per_domain or self.opts.concurrency,
                            delay=self.opts.delay, adaptive=self.opts.adaptive,
                            max_delay=max(60.0, self.opts.delay))
        # robots.txt is asked for as the pages are: with the downloader's User-Agent
        return open_gate(f"sqlite:///{self.opts.data_dir / 'politeness.db'}", rules=rules,
                         robots=self.opts.robots, user_agent=user_agent)

    async def _tick(self, queue: Any, on_progress: Callable[[CrawlProgress], None] | None) -> None:
        while True:
            await asyncio.sleep(0.5)
            with contextlib.suppress(Exception):
                self.progress.queued = await queue.length()
            self._count()
            if on_progress is not None:
                on_progress(self.progress)

    def _count(self, *, flush: bool = False) -> None:
        """The run's counters for its runner (pages, items, errors...), when one runs it."""
        if not sdk.under_runner():
            return
        p = self.progress
        sdk.set_counters({"pages": p.pages, "items": p.items, "errors": p.errors,
                          "links": p.links, "queued": p.queued, "skipped": p.skipped,
                          "robots": p.robots, "robots_unavailable": p.robots_unavailable})
        if flush:
            sdk.flush()

    async def _archived(self, urls: list[str]) -> set[str]:
        """Which of ``urls`` the last segment admitted: the recrawl's fast path
        revalidates every one of them (one lookup of the stored keys, no write)."""
        from crawlhub.frontier.seed import Seed

        assert self.services is not None and self._previous is not None
        frontier = self.services.frontiers[QUEUE]
        keys: dict[str, str] = {}
        for url in urls:
            try:
                keys[url] = frontier.keys.key(Seed(url))
            except (CrawlhubError, ValueError):
                continue  # the hub names what is wrong with it
        found = await frontier.store.stored(self._previous, list(keys.values()))
        return {url for url, key in keys.items() if key in found}

    async def _written(self, messages: Sequence[Message]) -> set[str]:
        written = getattr(self.sink, "written", None)
        if written is None:  # a sink with no index of what it holds: its keys dedup
            return set()
        urls = [str(m.payload.get("url")) for m in messages]
        return set(await written(urls))

    def _note_start(self, page: CrawledPage) -> None:
        """Whether a start URL's server answered (a later try may, after one that did not)."""
        url = str(page.task.get("url"))
        refusal, fetched = page.refusal, page.fetched
        if refusal is not None and refusal.status == 0:
            self.progress.unreachable[url] = refusal.error or "no answer"
        elif refusal is None and fetched.outcome == CONNECTION_ERROR and not fetched.status:
            why = fetched.error or "no answer"
            went = urlsplit(fetched.final_url).netloc
            if went and went != urlsplit(url).netloc:  # a redirect led off to it
                why = f"redirected to {went}, which gave no answer: {why}"
            self.progress.unreachable[url] = why
        else:
            self.progress.unreachable.pop(url, None)

    async def _on_pages(self, pages: list[CrawledPage]) -> None:
        """Admit the links found, then write the items (links first: a kill after the
        items were written must not lose the pages only they lead to)."""
        progress = self.progress
        links: dict[str, int] = {}
        items: list[dict[str, Any]] = []
        for page in pages:
            fetched, extracted = page.fetched, page.extracted
            if page.skipped:
                progress.skipped += 1
                continue
            if page.task.get("url") in self.starts:
                self._note_start(page)
            if page.fetched.outcome == ROBOTS_DISALLOWED:
                refusal = page.refusal
                if refusal is not None and refusal.unavailable:
                    progress.robots_unavailable += 1
                    progress.robots_failures.setdefault(refusal.origin, refusal)
                else:
                    progress.robots += 1
                continue
            progress.pages += 1
            if page.unchanged:
                progress.unchanged += 1
                progress.not_modified += fetched.status == 304
                continue
            if extracted is None:
                progress.errors += 1
                continue
            depth = int(page.task.get("depth") or 0) + 1
            for link in extracted.links:
                links.setdefault(link, depth)
            if extracted.noindex:
                progress.noindex += 1
                continue
            item: dict[str, Any] = {"url": page.task.get("url"), "status": fetched.status,
                                    "title": extracted.title}
            if fetched.final_url != item["url"]:
                item["final_url"] = fetched.final_url
            canonical = extracted.canonical
            if canonical is not None and canonical != item["url"]:
                # the page's own key hint: its copies make one item (the sink is keyed
                # by url), and the canonical URL, once written, is not fetched again
                item["fetched_url"], item["url"] = item["url"], canonical
            item.update(extracted.fields)
            items.append(item)
        if links:
            assert self.services is not None
            progress.links += await self.seen.submit(
                self.services.hub, links, pages,
                None if self._previous is None else self._archived)
        if items:
            result = await self.sink.write_batch(items)
            progress.items += result.inserted

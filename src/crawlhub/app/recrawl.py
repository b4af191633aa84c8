"""The fast path of ``crawlhub crawl --recrawl``: every URL the last segment archived is
revalidated straight from the archive, a batch at a time, without hub, queue or ledger.

A batch of ``batch`` archived seeds costs: one archive read, one lookup of the stored
keys (which of them this segment admitted already: those are the agent's - start URLs,
sitemap URLs, retries), one validators read, the conditional GETs (``concurrency`` at
once, the next batch's starting while this one's last answers come), then, once all of
it answered, one ``on_pages`` call for the changed pages (links, then items), one hub
submit for what the agent must do (errors to retry, robots refusals), one validators
write, one admission of the URLs settled into this segment (the next recrawl's archive)
and the cursor saved. A 304 or an unchanged body costs its request and a share of those
writes: no task, lease, ack or ledger row. A kill loses nothing: the batches after the
saved cursor are revalidated again, less what this segment admitted already (what was
written is not written twice: the sink keeps content hashes, and remembered validators
make those pages 304s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from crawlhub.agents.agent import CrawledPage
from crawlhub.agents.codes import ResultCodes
from crawlhub.agents.downloader import Fetched
from crawlhub.agents.extract import ExtractionRules, ParseError
from crawlhub.core.errors import FrontierError
from crawlhub.core.jobprotocol import EXIT, PAUSE
from crawlhub.fetch.http import Request
from crawlhub.frontier.conditional import Revalidation
from crawlhub.frontier.manager import Frontier
from crawlhub.frontier.seed import Seed
from crawlhub.frontier.store import Entry
from crawlhub.frontier.validators import Validators
from crawlhub.queues.base import Message

#: Archived seeds revalidated per batch (one archive read, one validators write).
BATCH = 1000
#: Batches fetched at once: the next one starts while the last answers of one come.
AHEAD = 2
#: Seconds between two looks at a paused run's control.
CONTROL_POLL = 0.1


@dataclass
class _Batch:
    end: str  # the archive cursor after this batch ("" : the last one)
    changed: list[CrawledPage] = field(default_factory=list)
    settled: list[tuple[str, Validators]] = field(default_factory=list)
    unchanged: int = 0
    not_modified: int = 0
    errors: int = 0
    #: the frontier entries (this segment) of the URLs settled here: admitted last
    entries: list[Entry] = field(default_factory=list)
    #: tasks for the agent: not settled here
    handed: list[dict[str, Any]] = field(default_factory=list)
    #: every URL of the batch answered (False: the run stopped in it)
    complete: bool = True


class RecrawlPass:
    """Revalidates the archive of segment ``previous`` into the frontier's current one.

    ``on_pages`` takes the changed pages (the crawl writes their links and items there);
    ``submit`` takes tasks for the agent; ``save(cursor)`` records how far the pass got
    once a batch is settled ("" : to the end). ``control`` (``state``: run / pause /
    exit) is looked at before each fetch; ``max_pages`` bounds the fetches it starts.
    ``gate`` (a ``DomainGate``) paces domains, ``robots`` (``refusal(url, ua)``) refuses
    URLs: those go to the agent, which reports them as it does. ``progress`` (the
    crawl's ``CrawlProgress``) counts what the pass settles itself: pages revalidated,
    unchanged ones (and 304s), errors not retried; ``handed`` counts the agent's.
    """

    def __init__(self, frontier: Frontier, previous: int, revalidate: Revalidation, *,
                 downloader: Any, rules: ExtractionRules, codes: ResultCodes,
                 on_pages: Callable[[list[CrawledPage]], Awaitable[Any]],
                 submit: Callable[[list[dict[str, Any]]], Awaitable[Any]],
                 save: Callable[[str], None], final: set[int], concurrency: int = 64,
                 gate: Any | None = None, robots: Any | None = None,
                 control: Any | None = None, max_pages: int | None = None,
                 progress: Any, batch: int = BATCH) -> None:
        self.frontier, self.previous, self.revalidate = frontier, previous, revalidate
        self.downloader, self.rules, self.codes = downloader, rules, codes
        self.on_pages, self.submit, self.save = on_pages, submit, save
        #: result codes settled here as the agent would (not retried: gone, refused)
        self.final = final
        self.concurrency, self.gate, self.robots = concurrency, gate, robots
        self.control, self.max_pages, self.batch = control, max_pages, batch
        self.user_agent = downloader.config.user_agent
        self.progress = progress
        self.handed = 0
        #: fetches started (what ``max_pages`` bounds)
        self.taken = 0
        #: the run's control said exit / the budget ran out: the pass stopped early
        self.exited = False
        self.limited = False

    async def run(self, cursor: str = "") -> bool:
        """Revalidate from ``cursor`` to the end; whether the pass got there."""
        store = self.frontier.store
        slots = asyncio.Semaphore(self.concurrency)
        ahead: deque[asyncio.Task[_Batch]] = deque()
        reading = True
        try:
            while True:
                while reading and len(ahead) < AHEAD and not self._stopped():
                    cursor, seeds = await store.archived(self.previous, cursor, self.batch)
                    reading = bool(cursor)
                    ahead.append(asyncio.create_task(self._fetch(seeds, cursor, slots)))
                if not ahead:
                    return not reading
                done = await ahead.popleft()
                await self._settle(done)
                if not done.complete:
                    # what answered is settled; the cursor stays: the rest is asked again
                    for task in ahead:
                        await self._settle(await task)
                    ahead.clear()
                    return False
                self.save(done.end)
        finally:
            for task in ahead:
                task.cancel()
            for task in ahead:
                with contextlib.suppress(BaseException):
                    await task

    def _stopped(self) -> bool:
        if self.control is not None and self.control.state == EXIT:
            self.exited = True
        return self.exited or self.limited

    async def _fetch(self, seeds: list[Seed], end: str, slots: asyncio.Semaphore) -> _Batch:
        batch = _Batch(end)
        urls: list[str] = []
        keys: list[str] = []
        entries: list[Entry] = []
        frontier = self.frontier
        now = time.time()
        for seed in seeds:
            try:
                entry = frontier.entry(Seed(seed.url), now, dispatched=True)
            except (FrontierError, ValueError):
                batch.handed.append({"url": seed.url, "depth": 0})
                continue
            if seed.method != "GET" or seed.body is not None:
                batch.handed.append({"url": seed.url, "depth": 0})
                continue
            entries.append(entry)
        # admitted in this segment already: the agent has them (start and sitemap URLs,
        # what this pass handed over, or settled whole, before a kill)
        taken = await frontier.store.stored(self.frontier.current_segment(),
                                            [e.key for e in entries])
        for entry in entries:
            if entry.key not in taken:
                urls.append(entry.seed.url)
                keys.append(entry.key)
        await self.revalidate.prepare(urls, keys)
        answers = await asyncio.gather(*(self._one(url, slots) for url in urls))
        by_url = {e.seed.url: e for e in entries}
        for url, answer in zip(urls, answers, strict=True):
            if answer is None:
                batch.complete = False
                self.revalidate.forget(url)
                continue
            if answer != "agent":
                batch.entries.append(by_url[url])
            if isinstance(answer, CrawledPage):
                batch.changed.append(answer)
                if answer.validators is not None:
                    batch.settled.append(answer.validators)
            elif isinstance(answer, tuple):
                batch.settled.append(answer[1])
                batch.unchanged += 1
                batch.not_modified += answer[0] == 304
            elif answer == "error":
                batch.errors += 1
            else:
                batch.handed.append({"url": url, "depth": 0})
        return batch

    async def _one(self, url: str, slots: asyncio.Semaphore
                   ) -> CrawledPage | tuple[int, tuple[str, Validators]] | str | None:
        """Revalidate ``url``: (status, validators) unchanged, a changed page, "error"
        (settled: not retried), "agent" (the agent does it), None (not asked: stopped)."""
        async with slots:
            while self.control is not None and self.control.state == PAUSE:
                await asyncio.sleep(CONTROL_POLL)
            if self._stopped():
                return None
            if self.max_pages is not None and self.taken >= self.max_pages:
                self.limited = True
                return None
            if self.robots is not None:
                try:
                    refused = await self.robots.refusal(url, self.user_agent)
                except ValueError:
                    refused = None
                if refused is not None:
                    self.revalidate.forget(url)
                    return "agent"  # it reports the refusal as it does
            self.taken += 1
            fetched = await self._download(url)
        unchanged, validators = self.revalidate.settle(url, fetched.status, fetched.headers,
                                                       fetched.body)
        if unchanged and validators is not None:
            return fetched.status, validators
        code = self.codes.code(fetched.outcome, fetched.status)
        if not fetched.ok:
            return "error" if fetched.status in self.final else "agent"
        try:
            extracted = self.rules.extract(fetched.body, fetched.final_url, depth=0,
                                           content_type=fetched.content_type,
                                           headers=fetched.headers)
        except ParseError:
            return "agent"  # reported as the parse error it is there
        fetched.body = b""
        message = Message("", {"url": url, "depth": 0}, 0, 0, 0.0)
        return CrawledPage("recrawl", message, fetched, extracted, code, validators=validators)

    async def _download(self, url: str) -> Fetched:
        conditional = self.revalidate.headers(url)
        request = Request(url, headers=conditional) if conditional else url
        gate = self.gate
        if gate is None:
            return await self.downloader.fetch(request)  # type: ignore[no-any-return]
        from crawlhub.agents.codes import CONNECTION_ERROR, TIMEOUT
        from crawlhub.agents.politeness.gate import domain_of, retry_after_seconds

        slot = await gate.acquire(domain_of(url))
        fetched: Fetched | None = None
        try:
            fetched = await self.downloader.fetch(request)
            return fetched
        finally:
            if fetched is None:
                await gate.release(slot)
            else:
                retry_after = retry_after_seconds(fetched.headers.get("Retry-After"),
                                                  time.time()) if fetched.status else None
                await gate.release(slot, fetched.status or None, retry_after,
                                   latency=fetched.elapsed,
                                   failed=fetched.outcome in (TIMEOUT, CONNECTION_ERROR))

    async def _settle(self, batch: _Batch) -> None:
        """Links and items of the changed pages, then the agent's tasks, then the
        validators (after the items: a kill in between asks for those pages again), then
        the URLs settled into this segment."""
        if batch.changed:
            await self.on_pages(batch.changed)
        if batch.handed:
            await self.submit(batch.handed)
        await self.revalidate.remember(batch.settled)
        # this segment's archive lists them as done, for the next recrawl (dispatched:
        # never leased); last, so a URL admitted here is one settled whole
        if batch.entries:
            await self.frontier.admit_entries(batch.entries)
        progress = self.progress
        progress.pages += batch.unchanged + batch.errors
        progress.unchanged += batch.unchanged
        progress.not_modified += batch.not_modified
        progress.errors += batch.errors
        self.handed += len(batch.handed)

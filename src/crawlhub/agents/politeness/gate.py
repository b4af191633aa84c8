"""The domain gate: per-domain concurrency and a minimum delay between request starts,
enforced across every agent on one backend, with 429 / 503 / Retry-After backoff.

An agent asks for a slot before each request to a domain and hands it back when the
response is in: ``slot = await gate.acquire(domain)`` ... ``await gate.release(slot,
status, retry_after)``. Slots are leases (:mod:`crawlhub.core.clock`): a slot its agent never
returns (SIGKILL) comes back ``rules.lease`` seconds after it was granted.

Cost in round trips: :meth:`DomainGate.acquire_many` grants up to ``n`` slots of a
domain in one trip when it has room (one slot per trip when a delay is set: the delay
paces starts anyway). :meth:`DomainGate.acquire` and :meth:`DomainGate.release` are
group commits: the acquires of one domain waiting in this process are asked for in one
``acquire_many`` (served first come, first served), and every release made while the
previous one is on the wire goes in one trip - so at any request rate the gate costs a
few trips per round trip time, not two per request.
While this gate holds slots, it renews their leases in one trip every third of the
shortest lease (on real time: a renewal is what a killed process stops doing), so a
request may outlast its lease and a killed agent's slots come back within one lease.
A waiting acquire sleeps until the pace or backoff ends, or, when every slot is held,
until a release by this process or a short poll (doubling up to ``max_poll``) - never a
busy loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from crawlhub.agents.politeness.adaptive import Feedback, feedback_of
from crawlhub.agents.politeness.base import DomainFigures, DomainRules, GateStore, Release
from crawlhub.agents.politeness.robots import Refusal, RobotsCache
from crawlhub.core.clock import Clock, system_clock

Sleep = Callable[[float], Awaitable[Any]]
log = logging.getLogger("crawlhub.agents.politeness")

#: Statuses that back the whole domain off even without a Retry-After header.
BACKOFF_STATUSES = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class Slot:
    """The right to run one request to ``domain``, leased until ``expires`` (epoch s)."""

    domain: str
    id: str
    expires: float


def domain_of(url: str) -> str:
    """The domain a URL's requests count against: its host name, lower case."""
    host = urlsplit(url).hostname
    if not host:
        raise ValueError(f"{url!r} has no host: the domain gate needs an absolute URL")
    return host


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header in seconds from ``now``: delta-seconds or an HTTP date;
    None if absent or unreadable (then the status alone decides)."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text) if len(text) < 12 else float("inf")  # capped by the rules
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


class DomainGate:
    """Per-domain slots and pace shared by every agent whose gate opens the same store.

    ``rules`` apply to every domain but those named in ``domains``. ``robots`` (None:
    robots.txt is not consulted) answers :meth:`allowed`.
    """

    def __init__(self, store: GateStore, *, rules: DomainRules | None = None,
                 domains: Mapping[str, DomainRules] | None = None,
                 robots: RobotsCache | None = None, user_agent: str = "crawlhub",
                 clock: Clock = system_clock, sleep: Sleep = asyncio.sleep,
                 min_poll: float = 0.005, max_poll: float = 0.25,
                 renew_sleep: Sleep = asyncio.sleep) -> None:
        self.store = store
        self.rules = rules or DomainRules()
        self.domains = {k.lower(): v for k, v in (domains or {}).items()}
        self.robots = robots
        self.user_agent = user_agent
        self.clock = clock
        self.sleep = sleep
        self.min_poll = min_poll
        self.max_poll = max_poll
        self.renew_sleep = renew_sleep
        #: (domain, slot id) -> the slot, for every slot granted and not yet released
        self._held: dict[tuple[str, str], Slot] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._name = uuid.uuid4().hex[:12]
        self._counter = itertools.count()
        #: domain -> event set when this process releases one of its slots
        self._freed: dict[str, asyncio.Event] = {}
        self._pending: list[Release] = []
        #: domain -> acquires waiting in this process, first come first served
        self._wanted: dict[str, list[asyncio.Future[Slot]]] = {}
        self._acquirers: dict[str, asyncio.Task[None]] = {}
        self._batch: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None

    def rules_for(self, domain: str) -> DomainRules:
        return self.domains.get(domain, self.rules)

    async def acquire(self, domain: str) -> Slot:
        """Wait for one slot of ``domain`` and return it. Joins the other acquires of
        the domain waiting in this process: one trip asks for all of them."""
        wanted = asyncio.get_running_loop().create_future()
        self._wanted.setdefault(domain, []).append(wanted)
        acquirer = self._acquirers.get(domain)
        if acquirer is None or acquirer.done():
            self._acquirers[domain] = asyncio.create_task(self._acquire_for(domain))
        return await wanted

    async def _acquire_for(self, domain: str) -> None:
        """Serve the domain's waiting acquires until none is left; slots meant for an
        acquire cancelled meanwhile go back at once."""
        try:
            while True:
                waiting = [f for f in self._wanted.get(domain, []) if not f.done()]
                self._wanted[domain] = waiting
                if not waiting:
                    del self._wanted[domain]
                    return
                try:
                    slots = await self.acquire_many(domain, len(waiting))
                except Exception as exc:  # the backend: every waiter hears it
                    for f in waiting:
                        if not f.done():
                            f.set_exception(exc)
                    continue
                unused: list[Slot] = []
                for slot in slots:
                    while waiting and waiting[0].done():
                        waiting.pop(0)
                    if waiting:
                        waiting.pop(0).set_result(slot)
                    else:
                        unused.append(slot)
                if unused:
                    await self.release_many([(s, None, None) for s in unused])
        finally:
            if self._acquirers.get(domain) is asyncio.current_task():
                del self._acquirers[domain]

    async def acquire_many(self, domain: str, n: int) -> list[Slot]:
        """Wait until ``domain`` has room, then return between 1 and ``n`` slots (one
        when the domain has a delay), all granted in one round trip."""
        if n < 1:
            raise ValueError(f"acquire_many needs n >= 1, not {n!r}")
        rules = self.rules_for(domain)
        poll = self.min_poll
        while True:
            now = self.clock()
            token = f"{self._name}.{next(self._counter)}"
            grant = await self.store.acquire(domain, n, now, rules, token)
            if grant.ids:
                slots = [Slot(domain, i, now + rules.lease) for i in grant.ids]
                for slot in slots:
                    self._held[(domain, slot.id)] = slot
                if self._renewer is None or self._renewer.done():
                    self._renewer = asyncio.create_task(self._renew_forever())
                return slots
            if grant.reason == "pace":
                await self.sleep(grant.wait)
            else:
                await self._wait_freed(domain, min(max(grant.wait, 0.0), poll))
                poll = min(poll * 2, self.max_poll)

    def backoff_for(self, domain: str, status: int | None, retry_after: float | None
                    ) -> float | None:
        """Seconds a response makes ``domain`` pause: its Retry-After (capped), else the
        rules' backoff for a 429 or 503; None for no pause."""
        rules = self.rules_for(domain)
        if retry_after is not None:
            if retry_after != retry_after:  # NaN: no number at all
                return None
            seconds = min(max(0.0, retry_after), rules.backoff_cap)
        elif status in BACKOFF_STATUSES and not rules.adaptive:  # adaptive: it cuts instead
            seconds = min(rules.backoff, rules.backoff_cap)
        else:
            return None
        return seconds or None

    async def release(self, slot: Slot, status: int | None = None,
                      retry_after: float | None = None, *, latency: float | None = None,
                      failed: bool = False) -> None:
        """Hand ``slot`` back; ``status`` / ``retry_after`` (seconds, see
        :func:`retry_after_seconds`) of its response may pause its domain. For a domain
        with adaptive rules, a ``status`` or ``latency`` (seconds the request took) or
        ``failed`` (timeout, connection error) is its answer's feedback; a slot handed
        back unused (none of them) says nothing."""
        feedback = None
        if status is not None or latency is not None or failed:
            feedback = feedback_of(status, latency, failed)
        await self.release_many([(slot, status, retry_after)], feedback=feedback)

    async def release_many(self, items: Sequence[tuple[Slot, int | None, float | None]],
                           *, feedback: Feedback | None = None) -> None:
        """:meth:`release` for several slots; joins the batch being gathered."""
        if not items:
            return
        now = self.clock()
        for slot, status, retry_after in items:
            self._held.pop((slot.domain, slot.id), None)
            pause = self.backoff_for(slot.domain, status, retry_after)
            rules = self.rules_for(slot.domain)
            fb = feedback if rules.adaptive else None
            self._pending.append(Release(slot.domain, slot.id,
                                         None if pause is None else now + pause,
                                         fb, rules if fb is not None else None))
        if self._batch is None:
            self._batch = asyncio.get_running_loop().create_future()
        batch = self._batch
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await asyncio.shield(batch)

    async def _flush(self) -> None:
        while self._pending:
            releases, self._pending = self._pending, []
            batch, self._batch = self._batch, None
            try:
                await self.store.release(releases, self.clock())
            except BaseException as exc:
                if batch is not None and not batch.done():
                    batch.set_exception(exc)
                    batch.exception()  # retrieved by its awaiters; none may be left
                if not isinstance(exc, Exception):
                    raise
                continue
            if batch is not None and not batch.done():
                batch.set_result(None)
            for domain in {r.domain for r in releases}:
                freed = self._freed.pop(domain, None)
                if freed is not None:
                    freed.set()

    async def renew(self) -> int:
        """Extend every slot this gate holds to a full lease from now, in one trip;
        how many were still held. :meth:`_renew_forever` calls it on its own."""
        now = self.clock()
        held = [(d, i, now + self.rules_for(d).lease) for d, i in list(self._held)]
        return await self.store.extend(held, now) if held else 0

    async def _renew_forever(self) -> None:
        while self._held:
            every = min(self.rules_for(d).lease for d, _ in self._held) / 3
            await self.renew_sleep(every)
            try:
                await self.renew()
            except Exception:  # noqa: BLE001 - the backend is out: try again next time
                log.warning("domain gate: renewing %d slot leases failed; retrying",
                            len(self._held), exc_info=True)

    async def _wait_freed(self, domain: str, seconds: float) -> None:
        freed = self._freed.setdefault(domain, asyncio.Event())
        waiter = asyncio.ensure_future(freed.wait())
        sleeper = asyncio.ensure_future(self.sleep(seconds))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, sleeper):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def reset(self) -> None:
        """Free every slot, end every pace and backoff and every robots.txt fetch claim
        on the store, at once. Only for a process that knows no other agent uses the
        store: the one-process crawl, holding its data dir's lock, takes back the slots
        and robots.txt claims of a run that was killed instead of waiting out their
        leases."""
        await self.store.reset()

    async def held(self, domain: str) -> int:
        """Slots of ``domain`` held now by every agent."""
        return await self.store.held(domain, self.clock())

    async def figures(self, limit: int = 100) -> list[DomainFigures]:
        """The adaptive figures of the domains answered last (every agent's answers)."""
        return await self.store.figures(self.clock(), limit)

    async def allowed(self, url: str, user_agent: str | None = None) -> bool:
        """Whether robots.txt lets ``user_agent`` (default: the gate's) fetch ``url``;
        always True when the gate was opened without robots."""
        if self.robots is None:
            return True
        return await self.robots.allowed(url, user_agent or self.user_agent)

    async def refusal(self, url: str, user_agent: str | None = None) -> Refusal | None:
        """Why robots.txt keeps ``user_agent`` (default: the gate's) from ``url``, or None
        (always None when the gate was opened without robots)."""
        if self.robots is None:
            return None
        return await self.robots.refusal(url, user_agent or self.user_agent)

    async def close(self) -> None:
        """Stop serving acquires (those still waiting are cancelled), send the releases
        gathered, close the store."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        for task in list(self._acquirers.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for waiting in self._wanted.values():
            for wanted in waiting:
                wanted.cancel()
        self._wanted.clear()
        if self._flusher is not None and not self._flusher.done():
            with contextlib.suppress(Exception):
                await self._flusher
        await self.store.close()

"""Cron for jobs: each job's next tick is a column; schedulers fire due ticks.

Several servers may run a scheduler on one database: a tick is fired by the one that
moves the job's ``next_fire`` from the tick to the following one (a compare-and-set), so
each tick runs once. A tick that finds the job at ``max_instances`` is recorded as a
``skipped`` run saying which runs were still going. Ticks missed while no scheduler ran
(a server down over a night) are not replayed: the job fires once, late, then follows
its cron from now.

The clock and the sleep are injectable: tests move time by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from crawlhub.control.jobs.model import JobSpec
from crawlhub.control.jobs.store import JobStore
from crawlhub.core.errors import ConflictError

log = logging.getLogger("crawlhub.control.cron")

#: Longest sleep between two looks at the table (jobs added meanwhile are seen then).
MAX_NAP = 1.0

Start = Callable[[JobSpec, float], Awaitable[object]]


class CronScheduler:
    """Fires due cron ticks: ``await tick()`` once, or ``run(stop)`` until ``stop``."""

    def __init__(self, store: JobStore, start: Start, *,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.store = store
        self.start = start
        self.clock = clock
        self.sleep = sleep
        self.fired = 0
        self.skipped = 0

    async def tick(self) -> list[str]:
        """Fire every due tick now; the names of the jobs fired or skipped."""
        now = self.clock()
        seen = []
        for name, tick in await self.store.due(now):
            spec = await self.store.find(name)
            if spec is None:
                continue
            following = spec.next_fire(max(now, tick)) if spec.enabled else None
            if not await self.store.claim_tick(name, tick, following):
                continue  # another scheduler fired it
            seen.append(name)
            if not spec.enabled:
                continue
            try:
                await self.start(spec, tick)
                self.fired += 1
            except ConflictError as exc:
                self.skipped += 1
                await self.store.record_skip(spec, trigger="cron", now=now,
                                             scheduled_for=tick, why=str(exc))
                log.info("cron tick of %s skipped: %s", name, exc)
            except Exception as exc:
                self.skipped += 1
                await self.store.record_skip(spec, trigger="cron", now=now, scheduled_for=tick,
                                             why=f"could not start: {type(exc).__name__}: {exc}")
                log.warning("cron tick of %s could not start: %s", name, exc)
        return seen

    async def run(self, stop: asyncio.Event) -> None:
        """Fire ticks until ``stop`` is set; a database outage is waited out."""
        while not stop.is_set():
            try:
                await self.tick()
                earliest = await self.store.earliest_fire()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cron scheduler: %s; trying again", exc)
                earliest = None
            nap = MAX_NAP if earliest is None else min(MAX_NAP, max(0.0, earliest - self.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=nap) if self.sleep is asyncio.sleep \
                    else await self.sleep(nap)

"""The request scheduler: who may send next, and when, per scope (global, job or domain).

Serial mode keeps one request in flight per scope and waits a uniform random gap in
``[rate_min, rate_max]`` after each response; concurrent mode caps requests in flight per
scope and meters them with a token bucket. Callers: ``Fetcher`` (``async with slot(...)``).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from crawlhub.fetch.cancel import CancellationToken
from crawlhub.fetch.http import Request
from crawlhub.fetch.timer import MonotonicTimer, Timer

Mode = Literal["serial", "concurrent"]
Scope = Literal["global", "job", "domain"]
MODES: tuple[str, ...] = ("serial", "concurrent")
SCOPES: tuple[str, ...] = ("global", "job", "domain")


def check_rate(rate_min: float, rate_max: float, *, where: str = "pipeline") -> None:
    """``ValueError`` unless ``0 <= rate_min <= rate_max`` (the serial gap range)."""
    for key, value in (("rate_min", rate_min), ("rate_max", rate_max)):
        if not isinstance(value, int | float) or math.isnan(value) or value < 0:
            raise ValueError(f"{where}.{key} must be a number of seconds >= 0, got {value!r}")
    if rate_min > rate_max:
        raise ValueError(
            f"{where}.rate_min ({rate_min:g}s) is greater than {where}.rate_max "
            f"({rate_max:g}s): the gap between two requests is drawn from "
            "[rate_min, rate_max]; set rate_min <= rate_max"
        )


@dataclass(slots=True)
class Slot:
    """A granted turn to send: the scope it belongs to and how long the caller waited."""

    lane: str
    waited: float
    gap: float | None = None  # serial mode: the gap that was due before this request


@dataclass(eq=False)
class _Waiter:
    key: tuple[int, int]
    job_code: str
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def __lt__(self, other: _Waiter) -> bool:
        return self.key < other.key


class _SerialLane:
    """One request in flight; the next one goes ``gap`` seconds after the last response.

    The waiter chosen to go next is picked when the gap is over, not when it starts, so
    the earliest-registered job that is waiting always goes next.
    """

    def __init__(self, key: str, clock: Timer) -> None:
        self.key = key
        self.clock = clock
        self.busy = False
        self.next_allowed = -math.inf
        self.pending_gap: float | None = None
        self.queue: list[_Waiter] = []
        self.gaps: list[float] = []
        self.grants: list[tuple[float, str]] = []

    async def acquire(self, waiter: _Waiter, token: CancellationToken | None) -> float | None:
        bisect.insort(self.queue, waiter)
        try:
            while True:
                if not self.busy and self.queue[0] is waiter:
                    delay = self.next_allowed - self.clock.now()
                    if delay <= 0:
                        self.queue.pop(0)
                        self.busy = True
                        self.grants.append((self.clock.now(), waiter.job_code))
                        return self.pending_gap
                    await self.clock.sleep(delay, token)
                    continue
                waiter.event.clear()
                if token is not None:
                    await token.run(waiter.event.wait())
                else:
                    await waiter.event.wait()
        except BaseException:
            if waiter in self.queue:
                self.queue.remove(waiter)
                self._wake_next()
            raise

    def release(self, gap: float) -> None:
        self.busy = False
        self.gaps.append(gap)
        self.pending_gap = gap
        self.next_allowed = self.clock.now() + gap
        self._wake_next()

    def _wake_next(self) -> None:
        if self.queue:
            self.queue[0].event.set()

    @property
    def in_flight(self) -> int:
        return 1 if self.busy else 0


class _ConcurrentLane:
    """At most ``concurrency`` in flight, started at ``rate`` per second (burst ``burst``)."""

    def __init__(
        self, key: str, clock: Timer, concurrency: int, rate: float | None, burst: int
    ) -> None:
        self.key = key
        self.clock = clock
        self.concurrency = concurrency
        self.rate = rate
        self.burst = burst
        self.in_flight = 0
        self.max_in_flight = 0
        self.waiting = 0
        self._sem: asyncio.Semaphore | None = None
        self._tat = -math.inf  # GCRA "theoretical arrival time"
        self.grants: list[tuple[float, str]] = []

    def _reserve(self) -> float:
        """The start time of the next token (reserved now, so waiters queue fairly)."""
        now = self.clock.now()
        if self.rate is None:
            return now
        interval = 1.0 / self.rate
        base = max(self._tat, now)
        start = max(now, base - (self.burst - 1) * interval)
        self._tat = base + interval
        return start

    async def acquire(self, job_code: str, token: CancellationToken | None) -> None:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.concurrency)
        self.waiting += 1
        try:
            if token is not None:
                await token.run(self._sem.acquire())
            else:
                await self._sem.acquire()
            try:
                start = self._reserve()
                delay = start - self.clock.now()
                if delay > 0:
                    await self.clock.sleep(delay, token)
            except BaseException:
                self._sem.release()
                raise
        finally:
            self.waiting -= 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.grants.append((self.clock.now(), job_code))

    def release(self) -> None:
        self.in_flight -= 1
        assert self._sem is not None
        self._sem.release()


class RequestScheduler:
    """Grants turns to send, per scope, in serial or concurrent mode.

    - ``mode="serial"``: one request in flight per scope; after each response a gap drawn
      uniformly from ``[rate_min, rate_max]`` (the releasing job's range). Jobs sharing a
      scope go in registration order: whenever the scope is free, the waiting request of
      the earliest-registered job goes next.
    - ``mode="concurrent"``: up to ``concurrency`` in flight per scope, started by a token
      bucket of ``rate_per_second`` (None = unmetered) with ``burst`` tokens.
    - ``scope``: ``"global"`` (one scope for everything), ``"job"`` or ``"domain"``.

    ``clock`` and ``rng`` are injectable so tests run on virtual time.
    """

    def __init__(
        self,
        *,
        mode: Mode = "serial",
        scope: Scope = "global",
        rate_min: float = 5.0,
        rate_max: float = 20.0,
        concurrency: int = 4,
        rate_per_second: float | None = None,
        burst: int = 1,
        clock: Timer | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"scheduler mode must be one of {MODES}, got {mode!r}")
        if scope not in SCOPES:
            raise ValueError(f"scheduler scope must be one of {SCOPES}, got {scope!r}")
        check_rate(rate_min, rate_max)
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        if rate_per_second is not None and rate_per_second <= 0:
            raise ValueError(f"rate_per_second must be > 0 or None, got {rate_per_second!r}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self.mode: Mode = mode
        self.scope: Scope = scope
        self.rate_min = float(rate_min)
        self.rate_max = float(rate_max)
        self.concurrency = concurrency
        self.rate_per_second = rate_per_second
        self.burst = burst
        self.clock: Timer = clock or MonotonicTimer()
        self.rng = rng or random.Random()
        self._jobs: dict[str, int] = {}
        self._rates: dict[str, tuple[float, float]] = {}
        self._order = itertools.count()
        self._seq = itertools.count()
        self._serial: dict[str, _SerialLane] = {}
        self._concurrent: dict[str, _ConcurrentLane] = {}

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> RequestScheduler:
        """Build from a ``PipelineConfig`` (mode, scope, rates, concurrency, bucket)."""
        options: dict[str, Any] = {
            "mode": config.mode,
            "scope": config.scope,
            "rate_min": config.rate_min,
            "rate_max": config.rate_max,
            "concurrency": config.concurrency,
            "rate_per_second": config.rate_per_second,
            "burst": config.burst,
        }
        options.update(overrides)
        return cls(**options)

    # ---- jobs -------------------------------------------------------------------------
    def register(
        self, job_code: str, *, rate_min: float | None = None, rate_max: float | None = None
    ) -> int:
        """Register a job (idempotent); its order decides who goes first in a shared scope.

        ``rate_min``/``rate_max`` give this job its own serial gap range.
        """
        if rate_min is not None or rate_max is not None:
            low = self.rate_min if rate_min is None else float(rate_min)
            high = self.rate_max if rate_max is None else float(rate_max)
            check_rate(low, high, where=f"pipeline.{job_code}")
            self._rates[job_code] = (low, high)
        if job_code not in self._jobs:
            self._jobs[job_code] = next(self._order)
        return self._jobs[job_code]

    def unregister(self, job_code: str) -> None:
        self._jobs.pop(job_code, None)
        self._rates.pop(job_code, None)

    @property
    def jobs(self) -> list[str]:
        """Registered jobs in registration order."""
        return sorted(self._jobs, key=self._jobs.__getitem__)

    def draw_gap(self, job_code: str = "") -> float:
        low, high = self._rates.get(job_code, (self.rate_min, self.rate_max))
        return self.rng.uniform(low, high)

    # ---- turns ------------------------------------------------------------------------
    def lane_key(self, target: Request | str, job_code: str = "") -> str:
        if self.scope == "global":
            return "*"
        if self.scope == "job":
            return f"job:{job_code}"
        url = target.url if isinstance(target, Request) else target
        return "domain:" + Request(url).domain

    @asynccontextmanager
    async def slot(
        self,
        target: Request | str,
        *,
        job_code: str = "",
        token: CancellationToken | None = None,
    ) -> AsyncIterator[Slot]:
        """Wait for a turn to send ``target`` (interrupted by ``token``), then hold it.

        The turn ends when the block exits: in serial mode the gap starts then.
        """
        if token is not None:
            token.raise_if_cancelled()
        key = self.lane_key(target, job_code)
        started = self.clock.now()
        if self.mode == "serial":
            lane = self._serial.get(key)
            if lane is None:
                lane = self._serial[key] = _SerialLane(key, self.clock)
            waiter = _Waiter((self.register(job_code), next(self._seq)), job_code)
            gap = await lane.acquire(waiter, token)
            try:
                yield Slot(key, self.clock.now() - started, gap)
            finally:
                lane.release(self.draw_gap(job_code))
        else:
            clane = self._concurrent.get(key)
            if clane is None:
                clane = self._concurrent[key] = _ConcurrentLane(
                    key, self.clock, self.concurrency, self.rate_per_second, self.burst
                )
            await clane.acquire(job_code, token)
            try:
                yield Slot(key, self.clock.now() - started)
            finally:
                clane.release()

    # ---- observation ------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """Requests waiting for a turn, over all scopes (the request queue depth)."""
        return sum(len(lane.queue) for lane in self._serial.values()) + sum(
            lane.waiting for lane in self._concurrent.values()
        )

    @property
    def in_flight(self) -> int:
        return sum(lane.in_flight for lane in self._serial.values()) + sum(
            lane.in_flight for lane in self._concurrent.values()
        )

    def lane(self, key: str) -> _SerialLane | _ConcurrentLane | None:
        """A scope's lane by key (``*``, ``job:<code>``, ``domain:<host>``), for tests."""
        return self._serial.get(key) or self._concurrent.get(key)

    def snapshot(self) -> dict[str, Any]:
        lanes: dict[str, dict[str, Any]] = {}
        for key, lane in self._serial.items():
            lanes[key] = {"in_flight": lane.in_flight, "waiting": len(lane.queue),
                          "sent": len(lane.grants)}
        for key, clane in self._concurrent.items():
            lanes[key] = {"in_flight": clane.in_flight, "waiting": clane.waiting,
                          "sent": len(clane.grants)}
        return {"mode": self.mode, "scope": self.scope, "waiting": self.waiting,
                "in_flight": self.in_flight, "lanes": lanes}

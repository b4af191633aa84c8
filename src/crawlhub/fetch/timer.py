"""Timers for the scheduler and retries: the real monotonic one and a manual one for tests.

Local waits, not leases (those read :data:`crawlhub.core.clock.Clock`, epoch seconds).
Every wait in ``fetch`` goes through a timer's ``sleep(seconds, token)`` so a test can
inject virtual time and read back exactly which gaps were slept.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from crawlhub.fetch.cancel import CancellationToken


class Timer(Protocol):
    """What the scheduler needs from time: now, and a sleep that a token interrupts."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float, token: CancellationToken | None = None) -> None: ...


class MonotonicTimer:
    """Real time: ``time.monotonic`` and an interruptible ``asyncio`` sleep."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float, token: CancellationToken | None = None) -> None:
        if token is not None:
            await token.sleep(seconds)
        elif seconds > 0:
            await asyncio.sleep(seconds)
        else:
            await asyncio.sleep(0)


class ManualTimer:
    """Virtual time for tests: ``sleep`` moves time forward at once and records the gap.

    A sleeper wakes at ``max(now, its start + seconds)``, so concurrent sleepers share the
    timeline instead of adding up. ``sleeps`` lists every requested sleep in order.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    async def sleep(self, seconds: float, token: CancellationToken | None = None) -> None:
        if token is not None:
            token.raise_if_cancelled()
        self.sleeps.append(seconds)
        wake_at = self._now + max(0.0, seconds)
        await asyncio.sleep(0)  # let sleepers that start at the same instant register too
        self._now = max(self._now, wake_at)
        if token is not None:
            token.raise_if_cancelled()

"""The suite's one fake clock and one ``wait_for``: tests never assert on wall-clock time.

``FakeClock`` is both kinds of clock crawlhub takes: a ``Callable[[], float]`` (queues,
hub state, frontier, leases) and the fetch ``Timer`` (``now()``, ``sleep()``). ``wait_for``
polls a condition that another task, thread or process makes true.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

from crawlhub.fetch.timer import ManualTimer

T = TypeVar("T")

#: Long enough for a loaded 2-core machine; a condition that holds returns at once.
WAIT = 30.0


class FakeClock(ManualTimer):
    """Virtual seconds that move only when told: ``advance``, ``set``, or a ``sleep`` on it.

    ``clock()`` and ``clock.now()`` read it; ``sleep`` (from the fetch layer's
    ``ManualTimer``) moves it forward at once and records the gap in ``sleeps``.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        super().__init__(start)

    def __call__(self) -> float:
        return self.now()

    def set(self, now: float) -> None:
        self._now = now


async def wait_for(
    condition: Callable[[], T | Awaitable[T]],
    what: str = "the condition",
    *,
    timeout: float = WAIT,
    every: float = 0.02,
) -> T:
    """Poll ``condition`` (sync or async) until it returns something truthy; return that.

    Fails the test naming ``what`` if it never does within ``timeout`` seconds. The bound
    only stops a hung test; no test asserts how long the wait took.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)

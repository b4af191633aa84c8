"""An asyncio loop on its own thread, where the scheduler's storage I/O runs.

Scrapy calls its scheduler synchronously from the reactor thread (``next_request``,
``enqueue_request``), whatever reactor the project chose. The scheduler answers those
calls from memory and leaves every frontier and queue call to this loop, so a slow
Redis round trip never stalls the engine.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

T = TypeVar("T")
log = logging.getLogger("crawlhub.contrib.scrapy")

#: Seconds ``stop`` waits for the loop's tasks to end on cancel.
STOP_TIMEOUT = 5.0


class LoopThread:
    """One event loop on one daemon thread; ``run`` blocks for a result, ``submit``
    does not."""

    inline = False

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coro).result(timeout)

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    def stop(self) -> None:
        """Cancel what still runs on the loop, stop it and join the thread. Never raises:
        a task that ignores its cancel is logged by name and left to the daemon thread."""
        if not self._thread.is_alive():
            return

        async def cancel_rest() -> list[str]:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            if not rest:
                return []
            _, stuck = await asyncio.wait(rest, timeout=STOP_TIMEOUT)
            return [t.get_name() for t in stuck]

        try:
            stuck = self.run(cancel_rest(), timeout=STOP_TIMEOUT + 5)
        except Exception as exc:  # the loop itself is stuck
            stuck = [f"the loop ({type(exc).__name__})"]
        if stuck:
            log.warning("%s: %s did not end on cancel; left running on the daemon thread",
                        self._thread.name, ", ".join(stuck))
            self.loop.call_soon_threadsafe(self.loop.stop)
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


class EngineLoop:
    """The engine's own asyncio loop (the asyncio reactor, Scrapy's default, or no
    reactor), with :class:`LoopThread`'s non-blocking half: the scheduler's storage I/O
    runs beside the engine on its thread, with no thread hop and no GIL hand-off per
    step. Nothing can block for a result here (``run`` would wait on the very loop that
    must produce it), so the callers that need one take their async paths."""

    inline = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """(On the engine's thread, where ``loop`` runs.)"""
        self.loop = loop
        self._thread = threading.get_ident()
        self._tasks: set[asyncio.Task[Any]] = set()

    def submit(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def call_soon(self, callback: Any, *args: Any) -> None:
        """Run ``callback(*args)`` on the loop: at once in line from its own thread, and
        through the loop's wake-up pipe from any other (an item writer's, say)."""
        if threading.get_ident() == self._thread:
            self.loop.call_soon(callback, *args)
        else:
            self.loop.call_soon_threadsafe(callback, *args)

    def stop(self) -> None:
        """Cancel what this loop's user started and has not ended."""
        me = asyncio.current_task(self.loop) if self.loop.is_running() else None
        for task in list(self._tasks):
            if task is not me:
                task.cancel()
        self._tasks.clear()


def running_engine_loop() -> asyncio.AbstractEventLoop | None:
    """The asyncio loop that runs Scrapy's engine on this thread, if one does: the
    asyncio reactor's loop (the reactor is installed and this is its loop), or, with no
    reactor installed, the running loop (Scrapy without a reactor). None under another
    reactor, or outside any loop."""
    import sys

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None:
        return loop
    return loop if getattr(reactor, "_asyncioEventloop", None) is loop else None


def _deferred(fut: Future[T]) -> Deferred[T]:
    """A Deferred fired on the reactor thread when ``fut`` (of another thread) is done;
    cancelling it cancels ``fut``."""
    from twisted.internet import reactor
    from twisted.internet.defer import CancelledError, Deferred
    from twisted.python.failure import Failure

    def cancel(_: Deferred[T]) -> None:
        fut.cancel()

    d: Deferred[T] = Deferred(cancel)

    def settle(done: Future[T]) -> None:
        if d.called:  # cancelled meanwhile
            return
        if done.cancelled():
            d.errback(Failure(CancelledError()))
            return
        exc = done.exception()
        if exc is not None:
            d.errback(Failure(exc))
        else:
            d.callback(done.result())

    fut.add_done_callback(
        lambda done: reactor.callFromThread(settle, done))  # type: ignore[attr-defined]
    return d


def engine_wait(fut: Future[T]) -> Awaitable[T]:
    """What the engine's coroutine can await for ``fut`` (of a :class:`LoopThread`): an
    asyncio future when an asyncio loop runs the engine (the asyncio reactor, or no
    reactor), a Deferred otherwise."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _deferred(fut)
    return asyncio.wrap_future(fut)

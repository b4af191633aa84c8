"""The cancellation token: one object every wait in fetch and pipeline honours.

``cancel()`` is thread-safe (callable from a signal handler, another thread or the API) and
wakes asyncio waiters on their own loops; an optional timeout cancels the token by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from crawlhub.core.errors import CancelledError

T = TypeVar("T")

_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class CancellationToken:
    """A cancel flag with a reason, an optional deadline and async-aware waits.

    ``timeout`` (seconds from creation) makes the token cancel itself with the reason
    ``"timeout after Ns"``; the deadline is checked by every read of ``is_cancelled`` and
    bounds every wait, so no timer thread is needed. A ``child()`` is cancelled with its
    parent but can also be cancelled alone.
    """

    def __init__(
        self,
        timeout: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        self._clock = clock
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._reason: str | None = None
        self._waiters: set[_Waiter] = set()
        self._callbacks: list[Callable[[str], object]] = []
        self.timeout = timeout
        self.deadline = clock() + timeout if timeout is not None else None

    def __repr__(self) -> str:
        state = f"cancelled: {self._reason}" if self._event.is_set() else "active"
        return f"<CancellationToken {state}>"

    # ---- state ------------------------------------------------------------------------
    @property
    def is_cancelled(self) -> bool:
        if self._event.is_set():
            return True
        if self.deadline is not None and self._clock() >= self.deadline:
            self.cancel(f"timeout after {self.timeout:g}s")
            return True
        return False

    @property
    def reason(self) -> str | None:
        self.is_cancelled  # noqa: B018 - reading it applies an expired deadline
        return self._reason

    def remaining(self) -> float | None:
        """Seconds until the deadline (None without a timeout, 0 once past)."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self._clock())

    def cancel(self, reason: str | None = None) -> bool:
        """Cancel; safe from any thread or a signal handler. False if already cancelled."""
        with self._lock:
            if self._event.is_set():
                return False
            self._reason = reason or "cancelled"
            self._event.set()
            waiters, self._waiters = self._waiters, set()
            callbacks, self._callbacks = self._callbacks, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is already closed
                loop.call_soon_threadsafe(_wake, fut)
        for callback in callbacks:
            callback(self._reason)
        return True

    def raise_if_cancelled(self) -> None:
        if self.is_cancelled:
            raise CancelledError(f"cancelled: {self._reason}")

    def on_cancel(self, callback: Callable[[str], object]) -> Callable[[], None]:
        """Call ``callback(reason)`` on cancel (at once if already); returns an unregister."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._remove_callback(callback)
        callback(self._reason or "cancelled")
        return lambda: None

    def _remove_callback(self, callback: Callable[[str], object]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._callbacks.remove(callback)

    def child(self, timeout: float | None = None) -> CancellationToken:
        """A token cancelled when this one is, that can also be cancelled on its own."""
        if timeout is None and self.deadline is not None:
            timeout = self.remaining()
        elif timeout is not None and self.deadline is not None:
            timeout = min(timeout, self.remaining() or 0.0)
        child = CancellationToken(timeout, clock=self._clock)
        unregister = self.on_cancel(lambda reason: child.cancel(f"parent {reason}"))
        child.on_cancel(lambda _reason: unregister())
        return child

    # ---- waiting ----------------------------------------------------------------------
    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until cancelled or ``timeout`` seconds pass; True if cancelled."""
        if self.is_cancelled:
            return True
        remaining = self.remaining()
        if remaining is not None:
            timeout = remaining if timeout is None else min(timeout, remaining)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        waiter = (loop, fut)
        with self._lock:
            if self._event.is_set():
                return True
            self._waiters.add(waiter)
        try:
            if timeout is None:
                await fut
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, timeout)
        finally:
            with self._lock:
                self._waiters.discard(waiter)
        return self.is_cancelled

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``; raise ``CancelledError`` as soon as the token is cancelled."""
        self.raise_if_cancelled()
        if await self.wait(max(0.0, seconds)):
            self.raise_if_cancelled()

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``; abort it and raise ``CancelledError`` when cancelled.

        A token already cancelled never starts the work (a coroutine is closed unawaited).
        """
        if self.is_cancelled:
            _discard(awaitable)
            self.raise_if_cancelled()
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            work.cancel()
            stop.cancel()
            raise
        if work.done():
            stop.cancel()
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise CancelledError(f"cancelled: {self._reason}")


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _discard(awaitable: Awaitable[Any]) -> None:
    if asyncio.iscoroutine(awaitable):
        awaitable.close()
    elif isinstance(awaitable, asyncio.Future):
        awaitable.cancel()


@contextlib.contextmanager
def ctrl_c_cancels(token: CancellationToken) -> Iterator[CancellationToken]:
    """First Ctrl-C cancels ``token`` gracefully; a second one aborts (KeyboardInterrupt).

    For the CLI: install around a run, the previous SIGINT handler comes back afterwards.
    Only works in the main thread (Python's signal rule); elsewhere it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield token
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: object) -> None:
        if token.cancel("interrupted (Ctrl-C); press Ctrl-C again to abort"):
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield token
    finally:
        signal.signal(signal.SIGINT, previous)

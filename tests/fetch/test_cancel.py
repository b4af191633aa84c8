"""The cancellation token: thread-safe cancel, async waits it interrupts, timeouts, Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

from crawlhub.core.errors import CancelledError
from crawlhub.fetch import CancellationToken, ctrl_c_cancels


def test_cancel_sets_the_flag_and_keeps_the_first_reason() -> None:
    token = CancellationToken()
    assert not token.is_cancelled
    assert token.cancel("stop requested over the API")
    assert not token.cancel("second cancel")
    assert token.is_cancelled
    assert token.reason == "stop requested over the API"
    with pytest.raises(CancelledError, match="stop requested"):
        token.raise_if_cancelled()


async def test_cancel_from_another_thread_wakes_an_async_waiter() -> None:
    token = CancellationToken()
    waiter = asyncio.create_task(token.wait())
    await asyncio.sleep(0)
    threading.Thread(target=token.cancel, args=("from a thread",)).start()
    assert await asyncio.wait_for(waiter, 5) is True
    assert token.reason == "from a thread"


async def test_sleep_is_interrupted_by_cancel() -> None:
    token = CancellationToken()
    asyncio.get_running_loop().call_soon(token.cancel, "interrupt")
    with pytest.raises(CancelledError):
        await asyncio.wait_for(token.sleep(60), 5)


async def test_run_aborts_the_awaited_work_when_cancelled() -> None:
    token = CancellationToken()
    finished = False

    async def slow() -> None:
        nonlocal finished
        await asyncio.sleep(60)
        finished = True

    task = asyncio.create_task(token.run(slow()))
    await asyncio.sleep(0)
    token.cancel("abort")
    with pytest.raises(CancelledError):
        await asyncio.wait_for(task, 5)
    assert not finished


async def test_a_pre_cancelled_token_never_starts_the_work() -> None:
    token = CancellationToken()
    token.cancel()
    started = False

    async def work() -> None:
        nonlocal started
        started = True

    with pytest.raises(CancelledError):
        await token.run(work())
    assert not started


async def test_a_timeout_cancels_the_token_by_itself() -> None:
    token = CancellationToken(timeout=0.05)
    assert await asyncio.wait_for(token.wait(), 5) is True
    assert token.is_cancelled
    assert token.reason == "timeout after 0.05s"


def test_a_timeout_is_read_from_an_injected_clock() -> None:
    now = [100.0]
    token = CancellationToken(timeout=10, clock=lambda: now[0])
    assert not token.is_cancelled
    now[0] = 110.0
    assert token.is_cancelled


def test_a_child_is_cancelled_with_its_parent_but_not_the_reverse() -> None:
    parent = CancellationToken()
    alone = parent.child()
    alone.cancel("only the child")
    assert not parent.is_cancelled
    child = parent.child()
    parent.cancel("run stopped")
    assert child.is_cancelled
    assert child.reason == "parent run stopped"


def test_negative_timeout_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        CancellationToken(timeout=-1)


def test_first_ctrl_c_cancels_gracefully_and_the_second_aborts() -> None:
    token = CancellationToken()
    previous = signal.getsignal(signal.SIGINT)
    with ctrl_c_cancels(token):
        signal.raise_signal(signal.SIGINT)
        assert token.is_cancelled
        assert "Ctrl-C" in (token.reason or "")
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is previous

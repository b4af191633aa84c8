"""Several processes on one queue: no message leased twice, none lost to a SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from tests.helpers import wait_for

from .conftest import Store

WORKER = Path(__file__).with_name("worker.py")


async def spawn(
    store: Store, name: str, mode: str, n: int, timeout: float
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        mode,
        store.url,
        store.prefix,
        name,
        str(n),
        str(timeout),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def report(worker: asyncio.subprocess.Process, tag: bytes) -> list[str]:
    assert worker.stdout is not None
    line = await asyncio.wait_for(worker.stdout.readline(), 60)
    assert line.startswith(tag + b" "), line
    ids: list[str] = json.loads(line[len(tag) + 1 :])
    return ids


async def test_leases_of_a_killed_worker_are_delivered_again(
    store: Store, unique_name: str
) -> None:
    queue = store.open().queue(unique_name)
    ids = await queue.push_many([({"task": i}, i % 2) for i in range(50)])
    worker = await spawn(store, unique_name, "hold", 20, 1.0)
    try:
        held = await report(worker, b"LEASED")
        assert len(held) == 20
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        await worker.wait()
    assert worker.returncode == -signal.SIGKILL

    consumer = store.open().queue(unique_name)
    delivered: dict[str, int] = {}

    async def all_delivered() -> bool:
        batch = await consumer.lease(10, visibility_timeout=60)
        delivered.update({m.id: m.attempts for m in batch})
        return len(delivered) >= len(ids)

    await wait_for(all_delivered, "every message back after the kill")
    assert sorted(delivered) == sorted(ids)
    assert {i: delivered[i] for i in held} == dict.fromkeys(held, 2)
    stats = await consumer.stats()
    assert (stats.retried, stats.leased, stats.ready) == (20, 50, 0)


async def test_processes_draining_one_queue_never_share_a_message(
    store: Store, unique_name: str
) -> None:
    ids = await store.open().queue(unique_name).push_many([({"task": i}, 0) for i in range(3000)])

    workers = [await spawn(store, unique_name, "drain", 5, 600) for _ in range(2)]
    try:
        for w in workers:  # both connected before either starts: their leases interleave
            assert await report(w, b"READY") == []
        for w in workers:
            assert w.stdin is not None
            w.stdin.write(b"go\n")
            await w.stdin.drain()
        results = await asyncio.gather(*(report(w, b"DRAINED") for w in workers))
    finally:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                w.kill()
            await w.wait()

    delivered = [i for r in results for i in r]
    assert sorted(delivered) == sorted(ids)

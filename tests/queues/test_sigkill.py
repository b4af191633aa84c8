"""At-least-once: a worker killed with SIGKILL while holding leases loses nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from .conftest import Store

HELPER = Path(__file__).with_name("hold_leases.py")


async def test_leases_of_a_killed_worker_are_delivered_again(
    store: Store, unique_name: str
) -> None:
    queue = store.open().queue(unique_name)
    ids = await queue.push_many([({"task": i}, i % 2) for i in range(50)])
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HELPER),
        store.url,
        store.prefix,
        unique_name,
        "20",
        "1.0",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(worker.stdout.readline(), 60)  # type: ignore[union-attr]
        assert line.startswith(b"LEASED "), line
        held = json.loads(line[len(b"LEASED ") :])
        assert len(held) == 20
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        await worker.wait()
    assert worker.returncode == -signal.SIGKILL

    consumer = store.open().queue(unique_name)
    delivered: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while len(delivered) < len(ids) and time.monotonic() < deadline:
        batch = await consumer.lease(10, visibility_timeout=60)
        delivered |= {m.id: m.attempts for m in batch}
        if not batch:
            await asyncio.sleep(0.05)

    assert sorted(delivered) == sorted(ids)
    assert {i: delivered[i] for i in held} == dict.fromkeys(held, 2)
    stats = await consumer.stats()
    assert (stats.retried, stats.leased, stats.ready) == (20, 50, 0)

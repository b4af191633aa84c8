"""Rough queue throughput: push_many, lease and ack rates on one backend (not a test).

Usage: python tests/queues/bench_throughput.py URL [MESSAGES] [BATCH]
e.g. ``sqlite:////tmp/qbench/q.db`` or ``redis://127.0.0.1:6379/0`` (keys under bench:<id>:).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from crawlhub.queues import open_backend


async def main(url: str, total: int, batch: int) -> None:
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    backend = open_backend(url, prefix=prefix)
    q = backend.queue("bench" + uuid.uuid4().hex[:8])
    items = [
        ({"url": f"https://example.com/item/{i}", "task_src": 1, "i": i}, i % 4)
        for i in range(total)
    ]
    try:
        t = time.perf_counter()
        for start in range(0, total, batch):
            await q.push_many(items[start : start + batch])
        push = time.perf_counter() - t

        t = time.perf_counter()
        leased = []
        while got := await q.lease(batch, visibility_timeout=600):
            leased += got
        lease = time.perf_counter() - t
        assert len(leased) == total

        t = time.perf_counter()
        for start in range(0, total, batch):
            await q.ack([m.id for m in leased[start : start + batch]])
        ack = time.perf_counter() - t

        t = time.perf_counter()
        for _ in range(1000):
            await q.length()
        length = (time.perf_counter() - t) / 1000
        print(
            f"{url} n={total} batch={batch}: push_many {total / push:,.0f}/s, "
            f"lease {total / lease:,.0f}/s, ack {total / ack:,.0f}/s, "
            f"length() {length * 1e6:,.0f} us"
        )
    finally:
        await q.purge()
        if hasattr(backend, "redis"):
            await backend.redis.delete(f"{prefix}q:{{{q.name}}}:seq")
        await backend.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(
        main(
            args[0],
            int(args[1]) if len(args) > 1 else 100_000,
            int(args[2]) if len(args) > 2 else 1000,
        )
    )

"""A queue worker in its own process, for the multi-process tests.

Usage: python worker.py hold|drain URL PREFIX QUEUE N VISIBILITY_TIMEOUT
``hold``: lease N, print ``LEASED <json ids>``, then hang (the SIGKILL victim).
``drain``: print ``READY []``, wait for a line on stdin, lease N at a time until the
queue is empty, print ``DRAINED <json ids>``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from crawlhub.queues import open_backend


async def main(mode: str, url: str, prefix: str, name: str, n: int, timeout: float) -> None:
    backend = open_backend(url, prefix=prefix)
    queue = backend.queue(name)
    if mode == "hold":
        leased = await queue.lease(n, visibility_timeout=timeout)
        print("LEASED " + json.dumps([m.id for m in leased]), flush=True)
        await asyncio.sleep(3600)
    await queue.length()  # connected and schema ready before the start signal
    print("READY []", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    got: list[str] = []
    while batch := await queue.lease(n, visibility_timeout=timeout):
        got += [m.id for m in batch]
    print("DRAINED " + json.dumps(got), flush=True)
    await backend.close()


if __name__ == "__main__":
    mode, url, prefix, name, n, timeout = sys.argv[1:7]
    asyncio.run(main(mode, url, prefix, name, int(n), float(timeout)))

"""A worker that leases a batch, says so, then hangs: the victim of the SIGKILL test.

Usage: python hold_leases.py URL PREFIX QUEUE N VISIBILITY_TIMEOUT
Prints ``LEASED <json list of ids>`` on one line once it holds the leases.
"""

from __future__ import annotations

import asyncio
import json
import sys

from crawlhub.queues import open_backend


async def main(url: str, prefix: str, name: str, n: int, timeout: float) -> None:
    backend = open_backend(url, prefix=prefix)
    leased = await backend.queue(name).lease(n, visibility_timeout=timeout)
    print("LEASED " + json.dumps([m.id for m in leased]), flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    url, prefix, name, n, timeout = sys.argv[1:6]
    asyncio.run(main(url, prefix, name, int(n), float(timeout)))

"""A process that uses the domain gate, for the cross-process politeness tests.

``python -m tests.agents.gate_child fetch URL PREFIX DOMAIN SITE N WORKERS``: WORKERS
tasks share N requests to SITE/work, each under a slot of DOMAIN (concurrency 2).
``python -m tests.agents.gate_child hold URL PREFIX DOMAIN NOW``: takes both slots of
DOMAIN at the frozen time NOW, prints ``held`` and waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp

from crawlhub.agents.politeness import DomainRules, open_gate

RULES = DomainRules(concurrency=2, lease=60)


async def fetch(url: str, prefix: str, domain: str, site: str, n: int, workers: int) -> None:
    gate = open_gate(url, prefix=prefix, rules=RULES)
    left = list(range(n))
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while left:
                left.pop()
                slot = await gate.acquire(domain)
                try:
                    async with session.get(f"{site}/work") as response:
                        await response.read()
                        status = response.status
                finally:
                    await gate.release(slot, status)

        await asyncio.gather(*(worker() for _ in range(workers)))
    await gate.close()


async def hold(url: str, prefix: str, domain: str, now: float) -> None:
    gate = open_gate(url, prefix=prefix, rules=RULES, clock=lambda: now)
    slots = await gate.acquire_many(domain, 2)
    print("held", len(slots), flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "fetch":
        asyncio.run(fetch(args[0], args[1], args[2], args[3], int(args[4]), int(args[5])))
    else:
        asyncio.run(hold(args[0], args[1], args[2], float(args[3])))

"""A frontier user for the kill -9 test: admits, leases and finishes seeds in a loop and
journals every admission and finish the frontier confirmed, until it is killed.

Run: python -m tests.frontier.resume_worker STORAGE_URL PREFIX JOURNAL RANDOM_SEED
"""

from __future__ import annotations

import asyncio
import random
import sys

from crawlhub.frontier import Frontier, Seed, build_frontier
from crawlhub.frontier.config import FrontierConfig

UNIVERSE = [f"http://site{i % 7}.example/p/{i}" for i in range(800)]
VARIANTS = ("", "#top", "?utm_source=x", "?_=1700000000123")
VISIBILITY = 0.5


def frontier(url: str, prefix: str) -> Frontier:
    config = FrontierConfig.model_validate({"segment": "10000d", "snapshot_interval": 0.05,
                                            "cache_size": 8, "expected_items": 500})
    return build_frontier("resume", config, url, prefix=prefix)


async def main(url: str, prefix: str, journal_path: str, seed: int) -> None:
    rng = random.Random(seed)
    f = frontier(url, prefix)
    await f.open()
    with open(journal_path, "a", buffering=1) as journal:  # one write() per line
        print("ready", flush=True)
        while True:
            batch = [Seed(u + rng.choice(VARIANTS)) for u in rng.sample(UNIVERSE, rng.randint(1, 40))]
            for s, ok in zip(batch, await f.admit(batch), strict=True):
                if ok:
                    journal.write(f"A {s.key}\n")
            for s in await f.lease(rng.randint(1, 12), VISIBILITY):
                journal.write(f"L {s.key}\n")
                roll = rng.random()
                if roll < 0.7:
                    if await f.finish(s, "ok"):
                        journal.write(f"F {s.key}\n")
                elif roll < 0.85:
                    await f.finish(s, "retry")
                # else: abandoned; the lease expires and the seed is dispatched again


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))

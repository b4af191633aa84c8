"""Chaos: SIGKILL ``crawlhub serve`` at random moments during 100,000 submissions.

Four clients post batches of tasks that carry their own uuid and URL and retry every
batch left unanswered or answered 503. The server is SIGKILLed at random points and
restarted on the same data; on Redis the Redis server is restarted mid-run as well.
Variants: SQLite and Redis, each with and without a frontier in front of the outbound.
Afterwards every queue is read from its backend.

The peer here is the promise itself: lost and doubled must be 0. The table also shows
how many requests failed during the outages, and with which status.

Run:  python bench/chaos.py [--n 100000] [--kills 5] [--batch 100] [--only sqlite,redis]

``--only scrapy`` (or ``sqlite,redis,scrapy``) adds the Scrapy table of
``bench/scrapy_chaos.py``: spiders SIGKILLed, items counted in the user's output.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tests.chaos.harness import ChaosReport, ChaosSpec, run_chaos  # noqa: E402


def table(reports: list[ChaosReport], n: int) -> Table:
    t = Table(title=f"crawlhub serve under SIGKILL: {n:,} tasks per run")
    for column in ("backend", "kills", "redis restarts", "answered 200", "found in queue",
                   "lost", "doubled", "tasks/s", "failed requests (status: count)",
                   "task answers"):
        t.add_column(column, justify="left" if "status" in column or column == "backend"
                     or column == "task answers" else "right")
    for r in reports:
        t.add_row(r.spec.label, str(r.kills), str(r.redis_restarts), f"{r.answered:,}",
                  f"{r.found:,}", str(r.lost), str(r.doubled),
                  f"{r.answered / r.seconds:,.0f}" if r.seconds else "-",
                  r.failures_text(),
                  ", ".join(f"{k}: {v:,}" for k, v in sorted(r.statuses.items())))
    return t


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="tasks per run")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs of the server per run")
    parser.add_argument("--batch", type=int, default=100, help="tasks per request")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients")
    parser.add_argument("--redis-restarts", type=int, default=1,
                        help="restarts of the Redis server per Redis run")
    parser.add_argument("--only", default="sqlite,redis", help="backends to run")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the kill points")
    from scrapy_chaos import add_arguments, main_scrapy

    add_arguments(parser)
    args = parser.parse_args()
    scrapy_failed = main_scrapy(args) if "scrapy" in args.only.split(",") else 0
    reports = []
    for backend in [b for b in args.only.split(",") if b != "scrapy"]:
        for frontier in (False, True):
            spec = ChaosSpec(backend=backend, frontier=frontier, tasks=args.n,
                             batch=args.batch, clients=args.clients, kills=args.kills,
                             redis_restarts=args.redis_restarts, seed=args.seed)
            Console(stderr=True).print(f"running {spec.label} ...")
            reports.append(await run_chaos(spec))
    if reports:
        Console(width=220).print(table(reports, args.n))
    bad = [r for r in reports if r.lost or r.doubled or r.answered != args.n]
    for r in bad:
        print(f"FAILED {r.spec.label}: lost {r.lost} (e.g. {r.lost_sample}),"
              f" doubled {r.doubled}, answered {r.answered}/{args.n}")
    return 1 if bad or scrapy_failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

"""Chaos: SIGKILL ``crawlhub serve`` at random moments during 100,000 submissions.

Four clients post batches of tasks that carry their own uuid and URL and retry every
batch left unanswered or answered 503. The server is SIGKILLed at random points and
restarted on the same data; on Redis the Redis server is restarted mid-run as well.
Variants: SQLite and Redis, each with and without a frontier in front of the outbound;
on Redis also tasks without a uuid (pushed by MULTI, not by the Lua script), known by
their number. Afterwards every queue is read from its backend.

The peer here is the promise itself: lost and doubled must be 0. A task without a uuid
that was sent again (its answer lost, or 503) may be there twice: nothing tells the hub
it was sent before; there doubled must not exceed resent. The table also shows how many
requests failed during the outages, and with which status.

The crawl row: ``crawlhub crawl`` over a 5,000-page local site SIGKILLed at 20 random
points (one per run, each then resumed by the same command): every resumed run must
finish by itself with every page once in its ``--out`` file (tests/chaos/crawl.py).

Run:  python bench/chaos.py [--n 100000] [--kills 5] [--batch 100]
                            [--only sqlite,redis,crawl,scrapy] [--crawl-pages 5000] [--crawl-kills 20]
                            [--crawl-aim]

``--only scrapy`` (or ``sqlite,redis,crawl,scrapy``) adds the Scrapy table of
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
from tests.chaos.crawl import CrawlChaosReport, CrawlChaosSpec, run_crawl_chaos  # noqa: E402
from tests.chaos.harness import ChaosReport, ChaosSpec, run_chaos  # noqa: E402


def table(reports: list[ChaosReport], n: int) -> Table:
    t = Table(title=f"crawlhub serve under SIGKILL: {n:,} tasks per run")
    for column in ("backend", "kills", "redis restarts", "answered 200", "found in queue",
                   "lost", "doubled", "resent", "tasks/s", "failed requests (status: count)",
                   "task answers"):
        t.add_column(column, justify="left" if "status" in column or column == "backend"
                     or column == "task answers" else "right")
    for r in reports:
        t.add_row(r.spec.label, str(r.kills), str(r.redis_restarts), f"{r.answered:,}",
                  f"{r.found:,}", str(r.lost), str(r.doubled), f"{r.resent:,}",
                  f"{r.answered / r.seconds:,.0f}" if r.seconds else "-",
                  r.failures_text(),
                  ", ".join(f"{k}: {v:,}" for k, v in sorted(r.statuses.items())))
    return t


def crawl_table(r: CrawlChaosReport) -> Table:
    t = Table(title=f"crawlhub crawl under SIGKILL: a {r.spec.pages:,}-page site, one kill per"
              " run, then the same command again")
    for column in ("kills", "kills mid-intake", "resumed runs that finished by themselves",
                   "pages expected", "pages found", "lost", "doubled", "undisturbed run"):
        t.add_column(column, justify="right")
    t.add_row(str(r.kills), str(r.mid_intake), f"{r.finished} of {r.spec.kills}",
              f"{r.expected:,}", f"{r.found:,}", str(r.lost), str(r.doubled),
              f"{r.clean_seconds:.1f} s")
    return t


async def crawl_row(args: argparse.Namespace) -> bool:
    """The crawl row (see the module docstring); True when it is clean."""
    spec = CrawlChaosSpec(pages=args.crawl_pages, kills=args.crawl_kills, seed=args.seed,
                          aim=args.crawl_aim)
    Console(stderr=True).print(f"running crawl ({spec.kills} kills, {spec.pages:,} pages) ...")
    r = await run_crawl_chaos(spec)
    Console(width=220).print(crawl_table(r))
    for problem in r.problems:
        print(f"FAILED crawl: {problem}")
    return r.finished == spec.kills and not r.lost and not r.doubled


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="tasks per run")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs of the server per run")
    parser.add_argument("--batch", type=int, default=100, help="tasks per request")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients")
    parser.add_argument("--redis-restarts", type=int, default=1,
                        help="restarts of the Redis server per Redis run")
    parser.add_argument("--only", default="sqlite,redis,crawl", help="rows to run")
    parser.add_argument("--crawl-pages", type=int, default=5000, help="pages of the crawl site")
    parser.add_argument("--crawl-kills", type=int, default=20, help="crawls SIGKILLed")
    parser.add_argument("--crawl-aim", action="store_true", help="every other crawl kill"
                        " waits for links recorded and not pushed (the intake window)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the kill points")
    from scrapy_chaos import add_arguments, main_scrapy

    add_arguments(parser)
    args = parser.parse_args()
    scrapy_failed = main_scrapy(args) if "scrapy" in args.only.split(",") else 0
    reports = []
    only = args.only.split(",")
    crawl_ok = await crawl_row(args) if "crawl" in only else True
    for backend in [b for b in only if b not in ("scrapy", "crawl")]:
        # (on Redis also tasks without a task_uuid: they are pushed by MULTI, not Lua)
        kinds = [(False, True), (True, True)] + ([(False, False)] if backend == "redis" else [])
        for frontier, uuids in kinds:
            spec = ChaosSpec(backend=backend, frontier=frontier, tasks=args.n,
                             batch=args.batch, clients=args.clients, kills=args.kills,
                             redis_restarts=args.redis_restarts, seed=args.seed, uuids=uuids)
            Console(stderr=True).print(f"running {spec.label} ...")
            reports.append(await run_chaos(spec))
    if reports:
        Console(width=220).print(table(reports, args.n))
    # Without a task_uuid a resent task may be pushed twice (nothing tells the hub it
    # was sent before): only more doubles than resent tasks is a fault there.
    bad = [r for r in reports if r.lost or r.answered != args.n
           or (r.doubled if r.spec.uuids else r.doubled > r.resent)]
    for r in bad:
        print(f"FAILED {r.spec.label}: lost {r.lost} (e.g. {r.lost_sample}),"
              f" doubled {r.doubled}, answered {r.answered}/{args.n}")
    return 1 if bad or scrapy_failed or not crawl_ok else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

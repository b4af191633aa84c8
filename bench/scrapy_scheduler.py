"""crawlhub's Scrapy scheduler against scrapy-redis: the same spider, site and Redis.

``python bench/scrapy_scheduler.py [--pages 20000] [--kill-pages 2000] [--concurrency 32]
[--redis redis://127.0.0.1:6379/0]``

In one run: scrapy-redis and crawlhub with 1 and with 2 spider processes crawl the whole
synthetic site of ``bench/crawl_site.py`` (pages of ~2 KB, 10 links each; a crawl from
page 0 reaches every page), and so does Scrapy's own in-memory scheduler with 1 process:
nothing stored, so the ceiling of any scheduler that stores the crawl; then each runs 2 processes on a slower copy of the site and
the busier one is SIGKILLed a third of the way through; the other goes on and, once every
spider has exited, one more is started to finish what the crawl still holds (scrapy-redis
spiders close when their queue is empty). It prints pages/s
(over the whole run, and from the first to the last page the site served, which leaves
Scrapy's start-up out), the Redis memory the crawl leaves per URL (MEMORY USAGE summed
over the run's keys, both with ``SCHEDULER_PERSIST``), and the pages never fetched after
the kill. crawlhub's bloom filter is sized with ``expected_items`` = the site's pages;
in the kill runs it is ``exact`` (each bloom positive confirmed against the archived
requests, ``archive: true``), as
scrapy-redis's set of fingerprints is: a page never fetched there is a page lost, never
a false positive taken for a duplicate.
The site runs on a thread of this process and counts what it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from crawl_site import page  # noqa: E402

SPIDER = HERE / "scrapy_scheduler_spider.py"
#: The row of Scrapy's own in-memory scheduler (1 process): no store, no Redis, nothing
#: kept on a kill - what the spider and Scrapy's engine cost with no scheduler store at
#: all, so the ceiling of any scheduler that keeps the crawl somewhere.
MEMORY = "Scrapy in memory (ceiling)"
#: The targets of issue 22: x scrapy-redis with 1 and with 2 spider processes.
TARGETS = {1: 1.5, 2: 1.1}


class Site:
    """The synthetic site on a thread, counting hits per page; ``delay`` slows pages;
    with ``times``, ``served_at`` keeps when (``perf_counter``) each page was served."""

    def __init__(self, pages: int, delay: float = 0.0, *, times: bool = False) -> None:
        self.pages, self.delay = pages, delay
        self.hits: Counter[int] = Counter()
        self.served_at: dict[int, list[float]] | None = defaultdict(list) if times else None
        self.agents: Counter[str] = Counter()  # pages served per spider (User-Agent)
        self.first = self.last = 0.0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._main, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def handle(request: web.Request) -> web.Response:
            i = int(request.match_info["i"])
            if not 0 <= i < self.pages:
                raise web.HTTPNotFound()
            if self.delay:
                await asyncio.sleep(self.delay)
            now = time.perf_counter()
            self.first = self.first or now
            self.last = now
            self.hits[i] += 1
            if self.served_at is not None:
                self.served_at[i].append(now)
            self.agents[request.headers.get("User-Agent", "")] += 1
            return web.Response(body=page(i, self.pages), content_type="text/html",
                                charset="utf-8")

        async def start() -> None:
            app = web.Application()
            app.router.add_get("/p/{i}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
            await site.start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def reset(self) -> None:
        self.hits.clear()
        if self.served_at is not None:
            self.served_at.clear()
        self.agents.clear()
        self.first = self.last = 0.0


@dataclass
class Run:
    name: str
    procs: int
    seconds: float
    served: float
    pages: int
    fetches: int
    lost: int
    redis_bytes: int

    @property
    def rate(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0

    @property
    def served_rate(self) -> float:
        return self.pages / self.served if self.served else 0.0


def settings_of(kind: str, tag: str, redis_url: str, pages: int, concurrency: int,
                lease: float, fp_rate: float, exact: bool = False) -> dict[str, str]:
    common = {"CONCURRENT_REQUESTS": str(concurrency),
              "CONCURRENT_REQUESTS_PER_DOMAIN": str(concurrency), "LOG_LEVEL": "WARNING",
              "TELNETCONSOLE_ENABLED": "False", "ROBOTSTXT_OBEY": "False",
              "SCHEDULER_PERSIST": "True", "REDIRECT_ENABLED": "False"}
    if kind == MEMORY:  # Scrapy's own scheduler and dupefilter: in memory, nothing stored
        return {k: v for k, v in common.items() if k != "SCHEDULER_PERSIST"}
    if kind == "scrapy-redis":
        return {**common, "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
                "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
                "REDIS_URL": redis_url, "SCHEDULER_QUEUE_KEY": f"{tag}:requests",
                "SCHEDULER_DUPEFILTER_KEY": f"{tag}:dupefilter"}
    return {**common, "SCHEDULER": "crawlhub.contrib.scrapy.Scheduler",
            "DUPEFILTER_CLASS": "crawlhub.contrib.scrapy.DupeFilter",
            "CRAWLHUB_URL": redis_url, "CRAWLHUB_PREFIX": f"{tag}:", "CRAWLHUB_CRAWL": "site",
            "CRAWLHUB_LEASE": str(lease),
            "CRAWLHUB_FRONTIER": json.dumps({"expected_items": pages, "fp_rate": fp_rate,
                                             **({"archive": True, "exact": True}
                                                if exact else {})})}


def spider(site: Site, settings: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    # (run from the log folder: bench/incremental.py would shadow the package Twisted needs)
    args = [sys.executable, "-m", "scrapy", "runspider", str(SPIDER)]
    for k, v in settings.items():
        args += ["-s", f"{k}={v}"]
    with open(log, "ab") as sink:
        return subprocess.Popen(args, env={**os.environ, "START": f"{site.url}/p/0"},
                                stdout=subprocess.DEVNULL, stderr=sink, cwd=str(log.parent))


def redis_bytes(client: object, tag: str) -> int:
    total = 0
    for key in client.scan_iter(match=f"{tag}:*", count=1000):  # type: ignore[attr-defined]
        total += int(client.memory_usage(key, samples=0) or 0)  # type: ignore[attr-defined]
    return total


def drop(client: object, tag: str) -> None:
    keys = list(client.scan_iter(match=f"{tag}:*", count=1000))  # type: ignore[attr-defined]
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])  # type: ignore[attr-defined]


def crawl(kind: str, procs: int, site: Site, args: argparse.Namespace, client: object,
          logs: Path, kill: bool = False) -> Run:
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    site.reset()
    settings = settings_of(kind, tag, args.redis, site.pages, args.concurrency, 5.0,
                           args.fp_rate, exact=kill)
    started = time.perf_counter()
    children = [spider(site, {**settings, "USER_AGENT": f"spider-{n}"},
                       logs / f"{kind}-{procs}-{kill}-{n}.log") for n in range(procs)]
    try:
        if kill:
            # the victim is the spider that served the most pages so far (an idle one
            # may have closed); a third of the site is done
            while len(site.hits) < site.pages // 3 and any(c.poll() is None for c in children):
                time.sleep(0.05)
            busiest = max(range(procs), key=lambda n: site.agents[f"spider-{n}"])
            children[busiest].send_signal(signal.SIGKILL)
        for child in children:
            child.wait(3600)
        seconds = time.perf_counter() - started
        if kill:  # a spider started afterwards finishes what the crawl still holds
            spider(site, settings, logs / f"{kind}-restart.log").wait(3600)
        used = redis_bytes(client, tag)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        drop(client, tag)
    fetched = len(site.hits)
    return Run(kind, procs, seconds, site.last - site.first, fetched,
               sum(site.hits.values()), site.pages - fetched, used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=20000)
    parser.add_argument("--kill-pages", type=int, default=2000)
    parser.add_argument("--kill-delay", type=float, default=0.02,
                        help="seconds per page of the site the kill runs crawl")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--fp-rate", type=float, default=0.001,
                        help="crawlhub's bloom false-positive rate (the frontier default)")
    parser.add_argument("--redis", default=os.environ.get("CRAWLHUB_TEST_REDIS_URL",
                                                          "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    import redis

    client = redis.Redis.from_url(args.redis)
    client.ping()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-scrapy-scheduler-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    site = Site(args.pages)
    runs = []
    for procs in (1, 2):
        for kind in ("scrapy-redis", "crawlhub", MEMORY)[:3 if procs == 1 else 2]:
            run = crawl(kind, procs, site, args, client, logs)
            runs.append(run)
            print(f"  {kind} x{procs}: {run.pages} pages in {run.seconds:.1f} s", flush=True)
    slow = Site(args.kill_pages, args.kill_delay)
    kills = [crawl(kind, 2, slow, args, client, logs, kill=True)
             for kind in ("scrapy-redis", "crawlhub")]

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Scrapy schedulers, {args.pages:,} pages, concurrency "
                        f"{args.concurrency}, one Redis")
    for col in ("scheduler", "procs", "pages", "fetches", "pages/s", "pages/s served",
                "x scrapy-redis", "target", "Redis B/URL", "scrapy-redis / crawlhub memory"):
        table.add_column(col, justify="right")
    peers = {r.procs: r for r in runs if r.name == "scrapy-redis"}
    for r in runs:
        peer = peers[r.procs]
        per_url = r.redis_bytes / max(r.pages, 1)
        peer_url = peer.redis_bytes / max(peer.pages, 1)
        ratio = r.rate / peer.rate if peer.rate else 0.0
        target = ""
        if r.name == "crawlhub":
            goal = TARGETS[r.procs]
            target = f">= {goal}: " + ("met" if ratio >= goal else "NOT met")
        table.add_row(r.name, str(r.procs), f"{r.pages:,}", f"{r.fetches:,}",
                      f"{r.rate:,.0f}", f"{r.served_rate:,.0f}",
                      f"{ratio:.2f}" if peer.rate else "-", target,
                      f"{per_url:.1f}" if r.name != MEMORY else "-",
                      f"{peer_url / per_url:.0f}x" if per_url else "-")
    console = Console(width=150)
    console.print(table)
    killed = Table(title=f"SIGKILL of the busier of 2 spiders a third of the way, then a"
                         f" spider restarted ({args.kill_pages:,} pages,"
                         f" {args.kill_delay * 1000:.0f} ms each)")
    for col in ("scheduler", "pages fetched", "pages never fetched (lost)", "fetches"):
        killed.add_column(col, justify="right")
    for r in kills:
        killed.add_row(r.name, f"{r.pages:,}", str(r.lost), f"{r.fetches:,}")
    console.print(killed)
    print(f"{MEMORY}: Scrapy's default scheduler and RFPDupeFilter, nothing stored (1"
          " process only: it cannot share a crawl); no scheduler that stores the crawl"
          " can be faster than it with the same spider")
    print(f"crawlhub: bloom filter sized with expected_items = the site's pages at fp_rate"
          f" {args.fp_rate} (a false positive takes a new page for a duplicate), exact in"
          " the kill runs (no false positive: a page never fetched is lost);"
          " CRAWLHUB_LEASE 5 s; logs in", logs)


if __name__ == "__main__":
    main()

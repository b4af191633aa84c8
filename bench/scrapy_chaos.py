"""Chaos, Scrapy row: 2 spiders on crawlhub's scheduler, the busier SIGKILLed a third of
the way, a fresh spider started at once; items counted in the user's output.

Outputs compared: Scrapy's own feed (``-o items-<n>.jsonl``, one file per process) and
crawlhub's ``ItemSink`` into SQLite (one file shared by the spiders), JSON lines (one
file per process) and PostgreSQL (one table; when a server is given). Lost = pages of
the site with no item in the output; doubled = items beyond one per page (a file per
spider dedups within its file only: an item the killed spider committed for a request
it had not finished yet is written again, into another file). "Reclaimed
in" = seconds from the kill until the last request the killed spider held was fetched
again (leases end a few seconds after a spider's last beat).

Run:  python bench/chaos.py --only scrapy   (or python bench/scrapy_chaos.py)
      [--scrapy-pages 3000] [--postgres postgresql://...] [--redis redis://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from scrapy_scheduler import SPIDER, Site  # noqa: E402


@dataclass
class ScrapyReport:
    output: str
    pages: int
    found: int
    lost: int
    doubled: int
    reclaimed: float | None
    seconds: float


def read_output(kind: str, where: list[Any]) -> Counter[str]:
    """Items per page URL in the user's output."""
    urls: list[str] = []
    if kind in ("feed", "jsonl"):
        for path in where:
            if Path(path).exists():
                for line in Path(path).read_text(errors="replace").splitlines():
                    try:
                        urls.append(json.loads(line)["url"])
                    except (ValueError, KeyError):
                        pass  # a torn last line of a killed feed
    elif kind == "sqlite":
        with sqlite3.connect(where[0]) as db:
            urls = [json.loads(d)["url"] for (d,) in db.execute("SELECT data FROM items")]
    else:
        import asyncpg

        async def fetch() -> list[str]:
            conn = await asyncpg.connect(where[0])
            try:
                rows = await conn.fetch(f'SELECT data FROM "{where[1]}"')
                await conn.execute(f'DROP TABLE IF EXISTS "{where[1]}"')
            finally:
                await conn.close()
            return [json.loads(r["data"])["url"] for r in rows]

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:  # bench/chaos.py calls this under its loop
            urls = pool.submit(asyncio.run, fetch()).result()
    return Counter(urls)


def run_one(kind: str, site: Site, redis_url: str, postgres: str | None,
            logs: Path) -> ScrapyReport:
    tag = f"chaos-{uuid.uuid4().hex[:8]}"
    work = logs / f"{kind}-{tag}"
    work.mkdir(parents=True)
    site.reset()
    settings = {"SCHEDULER": "crawlhub.contrib.scrapy.Scheduler",
                "DUPEFILTER_CLASS": "crawlhub.contrib.scrapy.DupeFilter",
                "CRAWLHUB_URL": redis_url, "CRAWLHUB_PREFIX": f"{tag}:",
                "CRAWLHUB_CRAWL": "site", "SCHEDULER_PERSIST": "True",
                "CONCURRENT_REQUESTS": "16", "CONCURRENT_REQUESTS_PER_DOMAIN": "16",
                "LOG_LEVEL": "INFO", "TELNETCONSOLE_ENABLED": "False",
                "ROBOTSTXT_OBEY": "False", "REDIRECT_ENABLED": "False"}
    where: list[Any] = []

    def start(n: int) -> subprocess.Popen[bytes]:
        extra = {"USER_AGENT": f"spider-{n}"}
        args = [sys.executable, "-m", "scrapy", "runspider", str(SPIDER)]
        if kind == "feed":
            where.append(work / f"items-{n}.jsonl")
            args += ["-o", str(where[-1])]
        else:
            extra["ITEM_PIPELINES"] = json.dumps({"crawlhub.contrib.scrapy.ItemSink": 900})
            if kind == "sqlite":
                where[:] = [work / "items.db"]
                extra["CRAWLHUB_ITEMS"] = str(where[0])
            elif kind == "jsonl":
                where.append(work / f"items-{n}.jsonl")
                extra["CRAWLHUB_ITEMS"] = str(where[-1])
            else:
                where[:] = [postgres, tag.replace("-", "_")]
                extra["CRAWLHUB_ITEMS"] = json.dumps(
                    {"type": "postgres", "url": postgres, "table": where[1]})
        for k, v in {**settings, **extra}.items():
            args += ["-s", f"{k}={v}"]
        with open(work / f"spider{n}.log", "ab") as log:
            return subprocess.Popen(args, env={**os.environ, "START": f"{site.url}/p/0"},
                                    stdout=subprocess.DEVNULL, stderr=log, cwd=str(work))

    began = time.perf_counter()
    children = [start(0), start(1)]
    try:
        while len(site.hits) < site.pages // 3 and any(c.poll() is None for c in children):
            time.sleep(0.05)
        victim = max(range(2), key=lambda n: site.agents[f"spider-{n}"])
        children[victim].send_signal(signal.SIGKILL)
        killed_at = time.perf_counter()
        children[victim].wait()
        children.append(start(2))  # a fresh spider, as after a crash
        for child in children:
            child.wait(3600)
        seconds = time.perf_counter() - began
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        import redis

        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{tag}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])
    assert site.served_at is not None
    refetched = [times[1] for times in site.served_at.values()
                 if len(times) > 1 and times[1] > killed_at]
    out = read_output(kind, where)
    every = {f"{site.url}/p/{i}" for i in range(site.pages)}
    found = every & set(out)
    return ScrapyReport(
        output={"feed": "Scrapy -o items.jsonl (feed)", "sqlite": "ItemSink -> SQLite",
                "jsonl": "ItemSink -> JSON lines, a file per spider",
                "postgres": "ItemSink -> PostgreSQL"}[kind],
        pages=site.pages, found=len(found), lost=len(every - found),
        doubled=sum(n - 1 for n in out.values() if n > 1),
        reclaimed=max(refetched) - killed_at if refetched else None, seconds=seconds)


def run_scrapy_chaos(pages: int, delay: float, redis_url: str,
                     postgres: str | None) -> list[ScrapyReport]:
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-scrapy-chaos-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    site = Site(pages, delay, times=True)
    kinds = ["feed", "sqlite", "jsonl"] + (["postgres"] if postgres else [])
    reports = []
    for kind in kinds:
        print(f"running Scrapy chaos: {kind} ...", file=sys.stderr, flush=True)
        reports.append(run_one(kind, site, redis_url, postgres, logs))
    print(f"logs in {logs}", file=sys.stderr)
    return reports


def scrapy_table(reports: list[ScrapyReport]) -> Any:
    from rich.table import Table

    t = Table(title="Scrapy under SIGKILL: 2 spiders on crawlhub's scheduler, the busier"
                    " killed a third of the way, a fresh one started; items in the output")
    for column in ("output", "pages", "items found", "lost", "doubled",
                   "reclaimed in (s)", "seconds"):
        t.add_column(column, justify="left" if column == "output" else "right")
    for r in reports:
        t.add_row(r.output, f"{r.pages:,}", f"{r.found:,}", str(r.lost), str(r.doubled),
                  "-" if r.reclaimed is None else f"{r.reclaimed:.1f}", f"{r.seconds:.1f}")
    return t


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scrapy-pages", type=int, default=3000, help="pages of the site")
    parser.add_argument("--scrapy-delay", type=float, default=0.02, help="seconds per page")
    parser.add_argument("--redis", default=os.environ.get("CRAWLHUB_TEST_REDIS_URL",
                                                          "redis://127.0.0.1:6379/0"))
    parser.add_argument("--postgres", default=os.environ.get("CRAWLHUB_TEST_POSTGRES_URL"),
                        help="PostgreSQL for the ItemSink row (none: no such row)")


def main_scrapy(args: argparse.Namespace) -> int:
    """The Scrapy table; 1 if an ItemSink output lost or doubled an item, or a restart
    took over 10 s to reclaim."""
    from rich.console import Console

    reports = run_scrapy_chaos(args.scrapy_pages, args.scrapy_delay, args.redis, args.postgres)
    Console(width=220).print(scrapy_table(reports))
    # a file per spider is keyed per file: an item committed by the killed spider whose
    # request it had not finished yet is written again into another file (not lost)
    bad = [r for r in reports if not r.output.startswith("Scrapy")
           and (r.lost or (r.doubled and "per spider" not in r.output)
                or (r.reclaimed or 0) > 10)]
    for r in bad:
        print(f"FAILED {r.output}: lost {r.lost}, doubled {r.doubled}, reclaimed in"
              f" {r.reclaimed}")
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    sys.exit(main_scrapy(parser.parse_args()))

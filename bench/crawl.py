"""Crawl: ``crawlhub crawl`` against a Scrapy spider on the same synthetic site.

The site (``bench/crawl_site.py``) runs in its own process: N pages of ~2 KB, 10 links
each, every page reachable from ``/p/0``. Its own capacity is measured once with a bare
aiohttp client loop (concurrency 64, no parsing): the bound no crawler can pass. Then
each crawler crawls all of it from ``/p/0`` at concurrency 64, writing ``{url, title}``
items to a JSON lines file, as a child process whose CPU time and peak RSS come from
``os.wait4``: Scrapy 2.x (``response.follow_all``, no autothrottle), ``crawlhub crawl``
(one process, embedded SQLite), and two ``crawlhub agent`` processes on Redis fed by a
hub in this process (``agents1`` / ``agents2``).

The second site is real HTML nobody here wrote: the Python documentation of Debian's
``python3-doc`` (``apt-get install python3-doc``; ~460 pages of 10-700 KB, relative links,
crawled from ``/index.html``), served the same way, crawled by Scrapy and ``crawlhub
crawl`` (its bound: every HTML file fetched once). ``--sites synthetic,docs`` picks.

``--scale K`` then crawls a K times larger site with ``crawlhub crawl`` alone and prints
how its peak RSS and CPU per page compare (the target: RSS within 1.2x at 10x the pages).

Run:  python bench/crawl.py [--pages 20000] [--only bound,scrapy,crawlhub,agents1,agents2]
      [--redis redis://127.0.0.1:6379/0] [--scale 10] [--sites synthetic,docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
CONCURRENCY = 64

SPIDER = '''
import scrapy

class Site(scrapy.Spider):
    name = "site"
    start_urls = [{start!r}]
    allowed_domains = ["127.0.0.1"]  # as crawlhub's same-domain links: the docs link out

    def parse(self, response):
        yield {{"url": response.url, "title": response.css("title::text").get()}}
        yield from response.follow_all(css="a")
'''


@dataclass
class Run:
    name: str
    pages: int
    seconds: float
    cpu: float | None = None
    rss_mb: float | None = None
    note: str = ""

    @property
    def rate(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0


def start_site(pages: int, docs: str | None = None) -> tuple[subprocess.Popen[str], int]:
    argv = [sys.executable, str(HERE / "crawl_site.py"), "--pages", str(pages)]
    if docs:
        argv += ["--docs", docs]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise SystemExit(f"the site did not start: {line!r}")
    return proc, int(line.split()[1])


def docs_root() -> str | None:
    """The Python documentation's HTML root of Debian's python3-doc, if installed."""
    import glob

    for found in sorted(glob.glob("/usr/share/doc/python3*/html/library/index.html")):
        return str(Path(found).parent.parent.resolve())
    return None


def docs_paths(root: str) -> list[str]:
    """Every HTML page of the docs, as a path (``x.html.gz`` served as ``x.html``)."""
    out = []
    for path in sorted(Path(root).rglob("*.html*")):
        rel = "/" + str(path.relative_to(root))
        if rel.endswith(".html.gz"):
            rel = rel[:-3]
        if rel.endswith(".html"):
            out.append(rel)
    return sorted(set(out))


async def bound(base: str, pages: int, paths: list[str] | None = None) -> Run:
    import aiohttp

    urls = iter(paths or [f"/p/{i}" for i in range(pages)])
    done = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        for path in urls:
            async with session.get(f"{base}{path}") as resp:
                await resp.read()
            done += 1

    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(CONCURRENCY)))
    return Run("site bound (bare aiohttp loop)", done, time.perf_counter() - start,
               note="no parsing, in the bench process")


def run_child(name: str, argv: list[str], out: Path, *, cwd: str | None = None,
              env: dict[str, str] | None = None) -> Run:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    urls = set()
    rows = 0
    if out.exists():
        with out.open() as f:
            for line in f:
                if line.strip():
                    rows += 1
                    urls.add(json.loads(line)["url"])
    note = f"{len(urls):,} unique urls in {rows:,} rows"
    if proc.returncode:
        note += f"; exit {proc.returncode}"
    return Run(name, len(urls), seconds, usage.ru_utime + usage.ru_stime,
               usage.ru_maxrss / 1024, note)


def scrapy_run(start: str, work: Path) -> Run:
    spider = work / "spider.py"
    spider.write_text(SPIDER.format(start=start))
    out = work / "scrapy.jsonl"
    argv = [sys.executable, "-m", "scrapy", "runspider", str(spider), "-o", f"{out}:jsonlines",
            "-s", f"CONCURRENT_REQUESTS={CONCURRENCY}",
            "-s", f"CONCURRENT_REQUESTS_PER_DOMAIN={CONCURRENCY}",
            "-s", "AUTOTHROTTLE_ENABLED=False", "-s", "LOG_LEVEL=WARNING",
            "-s", "ROBOTSTXT_OBEY=False", "-s", "TELNETCONSOLE_ENABLED=False",
            "-s", "DOWNLOAD_DELAY=0"]
    return run_child("scrapy", argv, out, cwd=str(work))


def crawlhub_run(start: str, work: Path) -> Run:
    out = work / "crawlhub.jsonl"
    argv = [str(Path(sys.executable).parent / "crawlhub"), "crawl", start, "--follow",
            "--concurrency", str(CONCURRENCY), "--per-domain", str(CONCURRENCY),
            "--out", str(out), "--data-dir", str(work / "crawl-data"), "--quiet",
            "--no-robots"]  # as Scrapy's ROBOTSTXT_OBEY=False
    return run_child("crawlhub crawl (1 process, SQLite)", argv, out)


def agents_run(base: str, work: Path, n: int, redis_url: str) -> Run:
    """``n`` ``crawlhub agent`` processes on one Redis (queues, hub state, frontier), items
    to a Redis stream; done when the queue and the hub's pending work are empty."""
    import signal
    import uuid

    import redis
    import yaml

    from crawlhub.config import load_config
    from crawlhub.services import Services

    prefix = f"bench-crawl-{uuid.uuid4().hex[:8]}:"
    cfg_file = work / f"agents{n}.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "data_dir": str(work / f"agents{n}-data"),
        "storage": {"queues": redis_url, "state": redis_url, "frontier": redis_url,
                    "redis_prefix": prefix},
        "inbound": [{"name": "http", "class": "http"}],
        "frontier": {"site": {"segment": "3650d", "exact": True}},
        "outbound": [{"name": "pages", "class": "queue", "frontier": "site",
                      "init": {"key": "pages"}}],
    }))
    (work / "extract.yaml").write_text("links: {follow: true}\n")
    stream = f"{prefix}items"
    sink = yaml.safe_dump({"type": "redis_stream", "url": redis_url, "stream": stream,
                           "key": ["url"], "prefix": prefix}, default_flow_style=True).strip()
    argv = [str(Path(sys.executable).parent / "crawlhub"), "agent", "-c", str(cfg_file),
            "--concurrency", str(CONCURRENCY), "--extract", str(work / "extract.yaml"),
            "--sink", sink, "--no-robots"]

    async def seed_and_wait(start: float, procs: list[subprocess.Popen[bytes]]) -> float:
        services = await Services.open(load_config(cfg_file))
        try:
            await services.hub.submit([{"url": f"{base}/p/0"}])
            for _ in range(n):
                procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
            queue = services.queues.queue("pages")
            quiet = 0
            while quiet < 2:
                await asyncio.sleep(0.25)
                busy = await queue.length() or await services.state.pending()
                quiet = 0 if busy else quiet + 1
            return time.perf_counter() - start
        finally:
            await services.close()

    procs: list[subprocess.Popen[bytes]] = []
    start = time.perf_counter()
    try:
        seconds = asyncio.run(seed_and_wait(start, procs))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
    cpu, rss = 0.0, 0.0
    for p in procs:
        _, _, usage = os.wait4(p.pid, 0)
        cpu += usage.ru_utime + usage.ru_stime
        rss = max(rss, usage.ru_maxrss / 1024)
    client = redis.Redis.from_url(redis_url)
    try:
        entries: Any = client.xrange(stream)
        urls = [json.loads(f[b"data"])["url"] for _, f in entries]
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
    return Run(f"{n} crawlhub agent{'s' if n > 1 else ''} (Redis)", len(set(urls)), seconds,
               cpu, rss, f"{len(set(urls)):,} unique urls in {len(urls):,} rows; CPU summed,"
               " RSS of the largest; the hub's Redis not counted")


def table(runs: list[Run], site: str, load: str) -> Table:
    t = Table(title=f"crawl of {site} at concurrency {CONCURRENCY} (load before: {load})")
    for column in ("crawler", "pages", "seconds", "pages/s", "CPU ms/page", "peak RSS MB",
                   "x scrapy", "note"):
        t.add_column(column, justify="left" if column in ("crawler", "note") else "right")
    scrapy = next((r for r in runs if r.name == "scrapy"), None)
    for r in runs:
        ratio = f"{r.rate / scrapy.rate:.2f}" if scrapy and scrapy.rate else "-"
        t.add_row(r.name, f"{r.pages:,}", f"{r.seconds:.1f}", f"{r.rate:,.0f}",
                  f"{1000 * r.cpu / r.pages:.2f}" if r.cpu is not None and r.pages else "-",
                  f"{r.rss_mb:.0f}" if r.rss_mb is not None else "-", ratio, r.note)
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=20000)
    parser.add_argument("--only", default="bound,scrapy,crawlhub,agents1,agents2")
    parser.add_argument("--redis", default=os.environ.get("CRAWLHUB_TEST_REDIS_URL",
                                                          "redis://127.0.0.1:6379/0"))
    parser.add_argument("--sites", default="synthetic,docs",
                        help="synthetic (generated pages) and/or docs (Debian's python3-doc)")
    parser.add_argument("--scale", type=int, default=0,
                        help="also crawl a site this many times larger with crawlhub crawl")
    args = parser.parse_args()
    only = set(args.only.split(","))
    sites = set(args.sites.split(","))
    console = Console(width=200)
    runs: list[Run] = []
    if "synthetic" in sites:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        site, port = start_site(args.pages)
        base = f"http://127.0.0.1:{port}"
        try:
            with tempfile.TemporaryDirectory(prefix="crawl-bench-") as tmp:
                work = Path(tmp)
                if "bound" in only:
                    runs.append(asyncio.run(bound(base, args.pages)))
                if "scrapy" in only:
                    runs.append(scrapy_run(f"{base}/p/0", work))
                if "crawlhub" in only:
                    runs.append(crawlhub_run(f"{base}/p/0", work))
                for n in (1, 2):
                    if f"agents{n}" in only:
                        runs.append(agents_run(base, work, n, args.redis))
        finally:
            site.kill()
            site.wait()
        console.print(table(runs, f"a {args.pages:,}-page synthetic site", load))
    if "docs" in sites:
        root = docs_root()
        if root is None:
            raise SystemExit("the docs site needs Debian's python3-doc: apt-get install -y"
                             " python3-doc (or --sites synthetic)")
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        site, port = start_site(0, docs=root)
        base = f"http://127.0.0.1:{port}"
        docs_runs: list[Run] = []
        try:
            with tempfile.TemporaryDirectory(prefix="crawl-bench-docs-") as tmp:
                work = Path(tmp)
                if "bound" in only:
                    paths = docs_paths(root)
                    docs_runs.append(asyncio.run(bound(base, len(paths), paths)))
                    docs_runs[-1].note = "every HTML file once, no parsing"
                if "scrapy" in only:
                    docs_runs.append(scrapy_run(f"{base}/index.html", work))
                if "crawlhub" in only:
                    docs_runs.append(crawlhub_run(f"{base}/index.html", work))
        finally:
            site.kill()
            site.wait()
        console.print(table(docs_runs, f"the Python docs (python3-doc, {root})", load))
    small = next((r for r in runs if r.name.startswith("crawlhub crawl")), None)
    if args.scale > 1 and small is not None:
        console.print(scale_table(small, scaled_run(args.pages * args.scale), args.scale))
    return 0


def scaled_run(pages: int) -> Run:
    site, port = start_site(pages)
    try:
        with tempfile.TemporaryDirectory(prefix="crawl-bench-scale-") as tmp:
            run = crawlhub_run(f"http://127.0.0.1:{port}/p/0", Path(tmp))
    finally:
        site.kill()
        site.wait()
    run.name = f"crawlhub crawl, {pages:,} pages"
    return run


def scale_table(small: Run, large: Run, k: int) -> Table:
    t = Table(title=f"crawlhub crawl as the site grows {k}x")
    for column in ("site", "pages/s", "CPU ms/page", "peak RSS MB", "RSS vs small", "note"):
        t.add_column(column, justify="left" if column in ("site", "note") else "right")
    for r in (small, large):
        t.add_row(f"{r.pages:,} pages", f"{r.rate:,.0f}",
                  f"{1000 * (r.cpu or 0) / max(r.pages, 1):.2f}", f"{r.rss_mb or 0:.0f}",
                  f"{(r.rss_mb or 0) / (small.rss_mb or 1):.2f}x", r.note)
    return t


if __name__ == "__main__":
    sys.exit(main())

"""Render: ``crawlhub crawl --render`` against Crawlee's ``PlaywrightCrawler``, same pages.

The site is ``crawlhub demo``'s JavaScript shop (``/js/``, ``--pages`` pages written by a
script: title, links, then the price 20 ms after load) in its own process. Each crawler
crawls all of it from ``/js/`` as a child process, on the same Debian Chromium
(``executable_path``), at the same concurrency (pages rendered at once: crawlhub's
``--render-concurrency``; Crawlee's ``ConcurrencySettings`` pinned to it, so its autoscaling
neither ramps up slowly nor backs off), each page waited for until ``#app[data-ready]``,
``{url, title}`` kept per page (crawlhub: its JSON lines file; Crawlee: ``push_data``, its
idiomatic dataset) and the same-host links followed. Each is otherwise as it comes:
crawlhub blocks images, fonts and media by default; Crawlee generates fingerprints by
default and opens a page per request.

Printed per crawler: pages, seconds, pages/s, and the peak memory of its whole process
tree (the Python process, the Playwright driver and every Chromium process, sampled every
0.2 s as the sum of their PSS: shared pages divided among those sharing them, so
Chromium's libraries count once), then the ratios.

With ``--memory N`` crawlhub alone crawls a JS shop of N pages and prints its tree's RSS
at every tenth of the way: the figure that memory stays flat over 10,000 rendered pages.

Run:  python bench/render.py [--pages 500] [--concurrency 4] [--only crawlhub,crawlee]
      python bench/render.py --memory 10000 --only crawlhub
Needs: pip install -e '.[render,bench]' and Debian's chromium (/usr/bin/chromium).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
CHROMIUM = os.environ.get("CRAWLHUB_CHROMIUM", "/usr/bin/chromium")
WAIT_FOR = "#app[data-ready]"

DEMO = """
import sys
from crawlhub.demo import DemoConfig, run_demo
run_demo(DemoConfig(js_pages=int(sys.argv[1]), items=0, grow_every=0), "127.0.0.1",
         int(sys.argv[2]))
"""

CRAWLEE = '''
import asyncio, sys
from crawlee import ConcurrencySettings
from crawlee.crawlers import PlaywrightCrawler, PlaywrightCrawlingContext

start, concurrency, chromium, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
args = ["--no-sandbox"] if __import__("os").geteuid() == 0 else []

async def main():
    crawler = PlaywrightCrawler(
        browser_type="chromium", headless=True,
        browser_launch_options={"executable_path": chromium, "args": args},
        concurrency_settings=ConcurrencySettings(
            min_concurrency=concurrency, max_concurrency=concurrency,
            desired_concurrency=concurrency),
        max_request_retries=2)

    @crawler.router.default_handler
    async def handle(context: PlaywrightCrawlingContext) -> None:
        await context.page.wait_for_selector(wait, state="attached")
        await context.push_data({"url": context.request.url,
                                 "title": await context.page.title()})
        await context.enqueue_links()

    await crawler.run([start])

asyncio.run(main())
'''


@dataclass
class Run:
    name: str
    pages: int
    seconds: float
    rss_mb: float
    samples: list[tuple[int, float]] = field(default_factory=list)
    note: str = ""

    @property
    def rate(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def tree_rss(pid: int) -> float:
    """MB of memory of ``pid`` and all its descendants now: their PSS (each shared page
    divided among the processes that map it), so Chromium's many processes sharing its
    libraries are not counted many times over."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:
            continue
    return total / 1e6


def watch(cmd: list[str], count: Callable[[], int], cwd: Path, extra_env: dict[str, str] | None = None,
          every: float = 0.2, marks: int = 0, total: int = 0) -> tuple[float, float,
                                                                     list[tuple[int, float]]]:
    """Run ``cmd``; its wall seconds, the peak RSS (MB) of its process tree and, with
    ``marks``, (pages done, RSS MB) at every ``total / marks`` pages."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env={**env(), **(extra_env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0.0
    samples: list[tuple[int, float]] = []
    next_mark = total // marks if marks else 0
    while proc.poll() is None:
        rss = tree_rss(proc.pid)
        peak = max(peak, rss)
        if marks:
            done = count()
            if done >= next_mark:
                samples.append((done, rss))
                next_mark += total // marks
        time.sleep(every)
    seconds = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}):\n{err[-2000:]}")
    return seconds, peak, samples


def lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def run_crawlhub(url: str, concurrency: int, work: Path, marks: int = 0,
                 total: int = 0) -> Run:
    out = work / "crawlhub.jsonl"
    cmd = [sys.executable, "-m", "crawlhub", "crawl", f"{url}/js/", "--follow", "--render",
           "--render-concurrency", str(concurrency), "--wait-for", WAIT_FOR, "--quiet",
           "--out", str(out), "--data-dir", str(work / "crawlhub-data")]
    seconds, peak, samples = watch(cmd, lambda: lines(out), work, marks=marks, total=total)
    items = [json.loads(x) for x in out.read_text().splitlines()]
    bad = sum(1 for i in items if not str(i.get("title", "")).endswith("JS shop"))
    return Run("crawlhub", len({i["url"] for i in items}), seconds, peak, samples,
               note=f"{bad} untitled" if bad else "")


def run_crawlee(url: str, concurrency: int, work: Path) -> Run:
    script = work / "crawlee_render.py"
    script.write_text(textwrap.dedent(CRAWLEE))
    storage = work / "storage"
    seconds, peak, _ = watch([sys.executable, str(script), f"{url}/js/", str(concurrency),
                              CHROMIUM, WAIT_FOR], lambda: 0, work,
                             extra_env={"CRAWLEE_STORAGE_DIR": str(storage)})
    urls: set[str] = set()
    bad = 0
    for f in (storage / "datasets" / "default").glob("*.json"):
        if f.name.startswith("__"):
            continue
        item = json.loads(f.read_text())
        urls.add(item["url"])
        bad += not str(item.get("title", "")).endswith("JS shop")
    return Run("crawlee", len(urls), seconds, peak, note=f"{bad} untitled" if bad else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--only", default="crawlhub,crawlee")
    ap.add_argument("--memory", type=int, default=0,
                    help="crawl a JS shop of this many pages with crawlhub and print its RSS"
                         " at every tenth")
    args = ap.parse_args()
    only = set(args.only.split(","))
    pages = args.memory or args.pages
    port = free_port()
    demo = subprocess.Popen([sys.executable, "-c", DEMO, str(pages), str(port)], env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    console = Console()
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        runs: list[Run] = []
        with tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
            work = Path(tmp)
            if args.memory:
                run = run_crawlhub(url, args.concurrency, work, marks=10, total=pages)
                table = Table(title=f"crawlhub crawl --render: memory (PSS) of its process tree over"
                                    f" {pages:,} JS pages (concurrency {args.concurrency})")
                table.add_column("pages done", justify="right")
                table.add_column("tree MB (PSS)", justify="right")
                for done, rss in run.samples:
                    table.add_row(f"{done:,}", f"{rss:,.0f}")
                console.print(table)
                console.print(f"{run.pages:,} pages in {run.seconds:.0f} s ({run.rate:.1f}/s),"
                              f" peak tree PSS {run.rss_mb:,.0f} MB {run.note}")
                return
            if "crawlhub" in only:
                (work / "h").mkdir()
                runs.append(run_crawlhub(url, args.concurrency, work / "h"))
            if "crawlee" in only:
                (work / "c").mkdir()
                runs.append(run_crawlee(url, args.concurrency, work / "c"))
    finally:
        demo.terminate()
        demo.wait()
    table = Table(title=f"JS shop of {pages:,} pages (+ /js/), {args.concurrency} pages"
                        " rendered at once, Debian Chromium")
    for col in ("crawler", "pages", "seconds", "pages/s", "peak tree MB (PSS)", "note"):
        table.add_column(col, justify="left" if col in ("crawler", "note") else "right")
    for r in runs:
        table.add_row(r.name, f"{r.pages:,}", f"{r.seconds:.1f}", f"{r.rate:.1f}",
                      f"{r.rss_mb:,.0f}", r.note)
    console.print(table)
    by = {r.name: r for r in runs}
    if "crawlhub" in by and "crawlee" in by:
        h, c = by["crawlhub"], by["crawlee"]
        console.print(f"crawlhub / crawlee: {h.rate / c.rate:.2f}x pages/s (goal >= 1.5x),"
                      f" {h.rss_mb / c.rss_mb:.2f}x peak memory (goal < 1)")


if __name__ == "__main__":
    main()

"""Start-up: how long crawlhub's commands take to start, beside Scrapy's in the same run.

Each figure is the median (and the slowest) of N runs of a fresh process:

- ``crawlhub --help`` and ``crawlhub crawl --help`` (import and argument parsing);
- ``crawlhub serve`` until ``GET /healthz`` answers 200 (a fresh data dir each run, the
  built-in config: SQLite, one http inbound), then SIGTERM;
- ``crawlhub crawl`` of a 1-page site (a local server on 127.0.0.1, this process) to
  its end;
- the peer: ``scrapy version`` and ``scrapy runspider`` of a 1-page spider on the same
  site.

Targets (issue 24): ``--help`` < 0.3 s, ``serve`` to a 200 on ``/healthz`` < 0.5 s. The
serve row is compared with its floor in the same run: the stack it serves with, FastAPI
on uvicorn, answering ``/healthz`` from a one-route app with nothing of crawlhub (on a
machine where that alone takes 0.5 s, the target cannot be met with this stack).

Run:  python bench/startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rich.console import Console
from rich.table import Table

BIN = Path(sys.executable).parent
FLOOR = "floor: FastAPI + uvicorn, one route, -> 200"
CRAWLHUB = str(BIN / "crawlhub")
PAGE = b"<html><head><title>one page</title></head><body><p>hello</p></body></html>"

SPIDER = '''
import scrapy

class One(scrapy.Spider):
    name = "one"
    custom_settings = {{"LOG_LEVEL": "WARNING", "ROBOTSTXT_OBEY": False,
                       "TELNETCONSOLE_ENABLED": False}}
    start_urls = ["{url}"]

    def parse(self, response):
        yield {{"url": response.url, "title": response.css("title::text").get()}}
'''


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = PAGE if self.path in ("/", "/index.html") else b"not found"
        self.send_response(200 if body is PAGE else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: CPU seconds (user + system) of each finished child, by the row measuring it: on a shared
#: machine the wall time swings with the load, the CPU a process burns much less.
CPU: list[float] = []


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], cwd: Path) -> float:
    cpu = _children_cpu()
    start = time.perf_counter()
    subprocess.run(argv, cwd=str(cwd), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    CPU.append(_children_cpu() - cpu)
    return wall


#: The floor of the serve row: the stack crawlhub serves with (FastAPI on uvicorn, no
#: WebSockets, as ``crawlhub serve``) answering one route, nothing of crawlhub.
FLOOR_APP = """
import sys
import uvicorn
from fastapi import FastAPI

app = FastAPI()


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", ws="none")
"""


def serve_to_healthz(work: Path, floor: bool = False) -> float:
    """``crawlhub serve`` (``floor``: :data:`FLOOR_APP`) until /healthz answers 200
    (polled every 5 ms)."""
    port = _free_port()
    data = Path(tempfile.mkdtemp(dir=work))
    cpu = _children_cpu()
    argv = ([sys.executable, "-c", FLOOR_APP, str(port)] if floor else
            [CRAWLHUB, "serve", "--bind", "127.0.0.1", "--port", str(port), "--data-dir",
             str(data)])
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=str(work), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"crawlhub serve exited {proc.returncode}")
            with suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                            timeout=1) as resp:
                    if resp.status == 200:
                        return time.perf_counter() - start
            time.sleep(0.005)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        CPU.append(_children_cpu() - cpu)  # (its shutdown included)
        shutil.rmtree(data, ignore_errors=True)


def cache_bytecode(work: Path) -> str:
    """Commands start from cached bytecode, as an installed package does (pip compiles
    it): with ``PYTHONDONTWRITEBYTECODE`` set, every child would compile crawlhub's and
    Scrapy's sources again on each run, and the warm-up run could not help. The children
    write their bytecode under ``work`` instead (``PYTHONPYCACHEPREFIX``), not beside the
    sources. Returns a note for the table, or ''."""
    if not os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        return ""
    os.environ["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    return "; PYTHONDONTWRITEBYTECODE dropped for the commands (bytecode cached in a temp dir)"


def measure(runs: int, fn: Callable[[], float]) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``runs`` runs, after one to warm up."""
    fn()  # warm: compiled bytecode, page cache
    CPU.clear()
    walls = [fn() for _ in range(runs)]
    return walls, CPU[-runs:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    console = Console(width=150)
    server = ThreadingHTTPServer(("127.0.0.1", _free_port()), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    scrapy = str(BIN / "scrapy")
    rows: list[tuple[str, list[float], str, str]] = []
    cpus: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bytecode = cache_bytecode(work)
        (work / "one.py").write_text(SPIDER.format(url=url))
        n = iter(range(10**6))

        def crawl() -> float:
            k = next(n)
            return timed([CRAWLHUB, "crawl", url, "--quiet", "--no-robots", "--out",
                          str(work / f"c{k}.jsonl"), "--data-dir", str(work / f"d{k}")], work)

        def runspider() -> float:
            return timed([scrapy, "runspider", "one.py", "-o", f"s{next(n)}.jsonl"], work)

        plan: list[tuple[str, Callable[[], float], str, str]] = [
            ("crawlhub --help", lambda: timed([CRAWLHUB, "--help"], work), "< 0.3 s",
             "scrapy version"),
            ("crawlhub crawl --help", lambda: timed([CRAWLHUB, "crawl", "--help"], work), "",
             "scrapy version"),
            ("crawlhub serve -> 200 on /healthz", lambda: serve_to_healthz(work), "< 0.5 s",
             FLOOR),
            ("crawlhub crawl, 1-page site", crawl, "", "scrapy runspider, 1 page"),
            ("scrapy version", lambda: timed([scrapy, "version"], work), "", ""),
            (FLOOR, lambda: serve_to_healthz(work, floor=True), "", ""),
            ("scrapy runspider, 1 page", runspider, "", ""),
        ]
        for name, fn, target, peer in plan:
            walls, cpu = measure(args.runs, fn)
            rows.append((name, walls, target, peer))
            cpus[name] = statistics.median(cpu)
            console.print(f"{name}: median {statistics.median(rows[-1][1]):.3f} s")
    server.shutdown()
    medians = {name: statistics.median(times) for name, times, _, _ in rows}
    load = os.getloadavg()
    table = Table(title=f"start-up, {args.runs} runs each (median, slowest); load average"
                        f" {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}{bytecode}")
    for col in ("command", "median s", "slowest s", "CPU s", "target", "met",
                "x peer (peer median)"):
        table.add_column(col, justify="left" if col in ("command", "target") else "right")
    for name, times, target, peer in rows:
        med = medians[name]
        met = ""
        if target:
            met = "yes" if med < float(target.split()[1]) else "NO"
        ratio = f"{med / medians[peer]:.2f}x ({peer} {medians[peer]:.3f})" if peer else (
            "floor" if name == FLOOR else "peer")
        table.add_row(name, f"{med:.3f}", f"{max(times):.3f}", f"{cpus[name]:.3f}", target,
                      met, ratio)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pause latency: how many pages a ``kind: crawl`` job (``crawlhub crawl --delay 0.1``) and
how many lines a plain subprocess job (no SDK) still produce after ``POST
/jobs/{name}/pause``, through the control plane ``crawlhub serve`` opens, on a local site.

Run: /work/venv/bin/python bench/pause.py [--watch 6] [--rounds 3]
Claim (issue 18, item 8): paused means stopped producing, within a second. Before the
fix the crawl fetched 57 more pages over 6 s (issue), and the plain job went on printing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web
from rich.console import Console
from rich.table import Table

from crawlhub.config.loader import default_config
from crawlhub.control.jobs import JobSpec
from crawlhub.control.plane import ControlPlane

console = Console(width=120)
PAGES = 5000
#: prints a numbered line 3 times a second, like the issue's job
TICKER = "import time\nn = 0\nwhile True:\n    print('tick', n, flush=True); n += 1; time.sleep(0.33)\n"


class Site:
    """A link graph on 127.0.0.1; ``times`` holds when each page was served."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.app = web.Application()
        self.app.router.add_get("/page/{n}", self.page)
        self.url = ""

    async def page(self, request: web.Request) -> web.Response:
        self.times.append(time.monotonic())
        n = int(request.match_info["n"])
        links = "".join(f'<a href="/page/{(n * 7 + k) % PAGES}">p</a>' for k in range(1, 8))
        return web.Response(text=f"<html><title>{n}</title><body>{links}</body></html>",
                            content_type="text/html")

    async def start(self) -> web.AppRunner:
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return runner


async def after_pause(plane: ControlPlane, name: str, run_id: str, produced: list[float],
                      watch: float) -> tuple[int, int, float | None, str | None]:
    """Pause ``name``; (items produced in the ``watch`` s after, those after its first
    second, seconds until the run's pause took effect, how)."""
    asked = time.monotonic()
    await plane.jobs.pause(name)
    took = how = None
    while time.monotonic() - asked < watch:
        if took is None:
            run = await plane.jobs.store.run(run_id)
            if run.paused:
                took, how = time.monotonic() - asked, run.paused
        await asyncio.sleep(0.05)
    after = [t for t in produced if t > asked]
    late = [t for t in after if t > asked + 1.0]
    await plane.jobs.resume(name)
    return len(after), len(late), took, how


async def main(watch: float, rounds: int) -> None:
    data = tempfile.mkdtemp(prefix="crawlhub-bench-pause-")
    site = Site()
    server = await site.start()
    plane = await ControlPlane.open(default_config(data))
    await plane.start()
    table = Table(title=f"Produced after POST /jobs/{{name}}/pause, watched {watch:g} s")
    for column in ("job", "round", "produced after pause", "after its 1st second",
                   "pause took effect", "how"):
        table.add_column(column, justify="right")
    ticks: list[float] = []
    try:
        await plane.jobs.create(JobSpec(
            name="crawl", kind="crawl",
            command=[f"{site.url}/page/0", "--follow", "--delay", "0.1", "--quiet",
                     "--data-dir", str(Path(data) / "crawl")]))
        await plane.jobs.create(JobSpec(name="ticker", command=[sys.executable, "-c", TICKER]))
        crawl = await plane.jobs.run("crawl")
        ticker = await plane.jobs.run("ticker")
        # the ticker's lines, as stored: the log sink is wrapped to time them
        sink = plane.jobs.runner.log_sink
        assert sink is not None

        async def timed(lines: list) -> None:  # type: ignore[type-arg]
            ticks.extend(time.monotonic() for line in lines
                         if line.run == ticker.id and line.message.startswith("tick"))
            await sink(lines)

        plane.jobs.runner.log_sink = timed
        while len(site.times) < 20:
            await asyncio.sleep(0.1)
        for k in range(rounds):
            for name, run_id, produced in (("crawl", crawl.id, site.times),
                                           ("ticker", ticker.id, ticks)):
                n, late, took, how = await after_pause(plane, name, run_id, produced, watch)
                table.add_row(name, str(k + 1), str(n), str(late),
                              "-" if took is None else f"{took:.2f} s", how or "-")
                await asyncio.sleep(2.0)  # running again before the next round
    finally:
        await plane.close()
        await server.cleanup()
        shutil.rmtree(data, ignore_errors=True)
    console.print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.watch, args.rounds))

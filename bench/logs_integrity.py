"""Log integrity: a job printing N numbered lines (default 200,000) as fast as it can,
run R times (default 5) through the control plane ``crawlhub serve`` opens (the default
embedded config: SQLite log store, direct transport), and the lines the user then finds
in the log store (``GET /logs?run=`` pages through the same store) counted per run.

Run: /work/venv/bin/python bench/logs_integrity.py [--lines 200000] [--runs 5]
     [--keep DIR] [--channel redis://127.0.0.1:6379/0]
``--channel``: the distributed path instead (lines through a Redis stream, stored by the
server's collector; a fresh key prefix, its stream deleted afterwards).
Claim (issue 18, item 5): every line is stored; none is dropped (``log_dropped`` 0).
Before the fix a run of 200,000 lines stored 103,500 here (179,066 in the issue).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

from crawlhub.config.loader import default_config
from crawlhub.control.jobs import JobSpec
from crawlhub.control.logs import LogQuery
from crawlhub.control.plane import ControlPlane

#: the job: numbered lines, written 1,000 at a time to a pipe, as fast as Python can
SPEW = ("import sys\nn = int(sys.argv[1])\nw = sys.stdout.write\n"
        "for i in range(0, n, 1000):\n"
        "    w(''.join(f'line {j}\\n' for j in range(i, min(n, i + 1000))))\n")
console = Console(width=120)


async def stored_lines(plane: ControlPlane, run_id: str, n: int) -> tuple[int, int]:
    """(lines of the run found in the store, distinct numbers among them), paged the
    way ``GET /logs?run=<id>&after=`` pages."""
    found = 0
    numbers: set[int] = set()
    after = 0
    while True:
        page = await plane.logs.search(LogQuery(run=run_id, after=after, limit=1000))
        for line in page.lines:
            if line.message.startswith("line "):
                found += 1
                numbers.add(int(line.message[5:]))
        if page.next is None:
            return found, len(numbers & set(range(n)))
        after = page.next


async def main(lines: int, runs: int, keep: str | None, channel: str | None) -> None:
    data = keep or tempfile.mkdtemp(prefix="crawlhub-logs-integrity-")
    config = default_config(data)
    if channel:
        config.control.channel = channel
        config.storage.redis_prefix = f"bench-logs-{os.getpid()}:"
    plane = await ControlPlane.open(config)
    await plane.start()
    path = f"distributed: Redis stream {channel} + collector" if channel else "embedded"
    table = Table(title=f"{lines:,} numbered lines printed as fast as possible, {runs} runs"
                  f" ({path}, SQLite log store)")
    for column in ("run", "status", "printed", "stored", "distinct", "missing",
                   "log_dropped", "seconds", "lines/s"):
        table.add_column(column, justify="right")
    try:
        await plane.jobs.create(JobSpec(name="spew",
                                        command=[sys.executable, "-c", SPEW, str(lines)]))
        for k in range(runs):
            started = time.perf_counter()
            run = await plane.jobs.run("spew")
            record = await plane.jobs.runner.wait(run.id)
            took = time.perf_counter() - started  # the run ends once its lines are sent
            await plane.logs.flush(120)  # (so a run that ended early is counted fairly)
            if channel:  # sent to the stream: wait until the collector stored them
                collector = plane.logs.collector
                assert collector is not None
                while len(await collector.client.xrange(collector.key, count=1)):
                    await asyncio.sleep(0.1)
            stored, distinct = await stored_lines(plane, run.id, lines)
            table.add_row(str(k + 1), record.status, f"{lines:,}", f"{stored:,}",
                          f"{distinct:,}", f"{lines - distinct:,}",
                          f"{record.log_dropped:,}", f"{took:.1f}", f"{lines / took:,.0f}")
    finally:
        if channel and plane.logs.collector is not None:
            await plane.logs.collector.client.delete(plane.logs.collector.key)
        await plane.close()
        if keep is None:
            shutil.rmtree(data, ignore_errors=True)
    console.print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", default=None, help="data dir to keep (default: a temporary"
                        " one, removed)")
    parser.add_argument("--channel", default=None, help="a Redis URL: the distributed path")
    args = parser.parse_args()
    asyncio.run(main(args.lines, args.runs, args.keep, args.channel))

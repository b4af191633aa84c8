"""Requests an incremental run needs for k new items of N, against a forward full scan.

Claim (seed 000): walking newest-first from ``total - batch_size`` back to the previous
run's total costs 1 + ceil(k / batch) requests, where the seed's original forward scan
(offset 0 -> total) costs ceil(N / batch) every time. Both strategies run for real
through crawlhub's JobRun against a local paged JSON API that counts requests
server-side, into a JSON-lines sink.

    python bench/incremental.py [--sizes 10000,100000] [--new 10,100,1000] [--batch 100]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from rich.console import Console
from rich.table import Table

from crawlhub.collect.build import new_run
from crawlhub.collect.config import CollectJobConfig
from crawlhub.collect.plan import IncrementalState, plan_incremental
from crawlhub.collect.store import Progress, open_metadata_store


class PagedApi:
    """``/items?offset=&limit=`` over ``total`` items made on demand; counts requests."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.requests = 0
        self.date = datetime.now().replace(microsecond=0).isoformat()

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        off, lim = int(request.query["offset"]), int(request.query["limit"])
        rows = [{"id": i, "date": self.date} for i in range(off, min(off + lim, self.total))]
        return web.json_response({"code": 0, "total": self.total, "items": rows})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job(url: str, strategy: str, batch: int, sink: Path) -> CollectJobConfig:
    return CollectJobConfig.model_validate(
        {
            "name": f"bench-{strategy}",
            "source": {"url": f"{url}/items", "date_field": "date"},
            "strategy": {"type": strategy, "batch_size": batch},
            "pipeline": {"rate_min": 0, "rate_max": 0, "progress_interval": 0},
            "sink": {"type": "jsonl", "path": str(sink), "fsync": False},
        }
    )


async def measure(n: int, k: int, batch: int, tmp: Path) -> dict[str, Any]:
    api = PagedApi(n)
    app = web.Application()
    app.router.add_get("/items", api.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"
    store = await open_metadata_store(f"sqlite:///{tmp}/meta-{n}-{k}.db")
    try:
        # The state a completed earlier run leaves when the source held n - k items.
        inc = job(url, "incremental", batch, tmp / f"inc-{n}-{k}.jsonl")
        state = plan_incremental(n - k, IncrementalState(), batch)
        state.sweeps = []
        await store.save_progress(
            Progress(job=inc.name, status="SUCCEEDED", state={"incremental": state.to_dict()})
        )
        began = time.perf_counter()
        result = await new_run(inc, store=store, config=None).run()
        inc_time = time.perf_counter() - began
        inc_requests, api.requests = api.requests, 0
        assert result.records_written >= k, result.summary()  # whole batches: >= k

        full = job(url, "full", batch, tmp / f"full-{n}-{k}.jsonl")
        began = time.perf_counter()
        result = await new_run(full, store=store, config=None).run()
        full_time = time.perf_counter() - began
        full_requests = api.requests
        assert result.records_written == n, result.summary()
    finally:
        await store.close()
        await runner.cleanup()
    return {
        "n": n,
        "k": k,
        "inc": inc_requests,
        "inc_s": inc_time,
        "full": full_requests,
        "full_s": full_time,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="N values, comma separated")
    parser.add_argument("--new", default="10,100,1000", help="k values, comma separated")
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    news = [int(x) for x in args.new.split(",")]
    table = Table(title=f"incremental (newest first) vs forward full scan, batch {args.batch}")
    for col in (
        "N items",
        "k new",
        "incremental requests",
        "full-scan requests",
        "request ratio",
        "incremental s",
        "full-scan s",
    ):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory(prefix="crawlhub-bench-") as tmp:
        for n in sizes:
            for k in news:
                row = await measure(n, k, args.batch, Path(tmp))
                table.add_row(
                    f"{n:,}",
                    f"{k:,}",
                    str(row["inc"]),
                    str(row["full"]),
                    f"{row['full'] / row['inc']:.0f}x",
                    f"{row['inc_s']:.2f}",
                    f"{row['full_s']:.2f}",
                )
    Console(width=140).print(table)


if __name__ == "__main__":
    asyncio.run(main())

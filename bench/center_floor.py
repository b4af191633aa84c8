"""The floor of ``bench/center.py``'s paced and throughput rows: the same hops with nothing
of crawlhub.

A job sends one message per request (a URL) to a relay (Redis Streams, XADD), the relay
passes it to one of two workers, the worker fetches the URL (one aiohttp session) and
answers the job with the fetch's time - the center's path (job -> center -> agent ->
site -> agent -> job) as bare redis-py and aiohttp in four processes, with one pipeline
per batch each way (the relay and the job ack a batch in the trip of their next read, as
the center does), no JSON, no signatures, no downloader. Its added latency (round trip
minus fetch) at the same rate on the same machine, in the same run, is what the
center's could be at best: the cost of the processes waking in turn on the cores they
share, and of the Redis round trips between. Without ``--site`` the workers answer at
once (no fetch).

At full rate (``--rate 0``) the job keeps ``--window`` requests in flight (each of that
many senders sends its next request when its last one's reply is back, as the center
row's job does), K workers (``--workers``) fetch pages ``/p/0`` .. ``/p/N-1``, and the
run's requests/s is the most a relay with the center's hops gets on this machine: the
floor of the center's throughput rows (K agents).

Run by ``bench/center.py`` (rows "floor: ..."); alone: ``python bench/center_floor.py job
[--pages 3000] [--rate 1000 | --rate 0 [--workers 2] [--window 256]] [--site URL]
[--redis URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

GROUP = "g"


async def _group(r: Any, key: str) -> None:
    with contextlib.suppress(Exception):  # BUSYGROUP: made by the other side first
        await r.xgroup_create(key, GROUP, id="0", mkstream=True)


async def relay(url: str, prefix: str, workers: int = 2) -> None:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    req = prefix + "req"
    await _group(r, req)
    out: list[tuple[str, Any]] = []
    done: list[bytes] = []
    while True:
        pipe = r.pipeline(transaction=False)
        for key, fields in out:
            pipe.xadd(key, fields)
        if done:
            pipe.xack(req, GROUP, *done)
            pipe.xdel(req, *done)
        pipe.xreadgroup(GROUP, "relay", {req: ">"}, count=500, block=1000)
        got = (await pipe.execute())[-1]
        out, done = [], []
        for _, entries in got or ():
            for mid, fields in entries:
                if fields.get(b"h") == b"stop":
                    return
                out.append((f"{prefix}w{random.randrange(workers)}", fields))
                done.append(mid)


async def worker(url: str, prefix: str, n: int, site: str, mod: int = 1000) -> None:
    """Worker ``n``: fetches ``/p/<request % mod>`` of ``site`` for each request."""
    import aiohttp
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    key = f"{prefix}w{n}"
    await _group(r, key)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
    replies: list[tuple[bytes, dict[str, Any]]] = []
    flusher: list[asyncio.Task[None]] = []

    async def flush() -> None:  # the replies of one loop turn, acks after (as Outbox)
        while replies:
            pipe = r.pipeline(transaction=False)
            ids = [mid for mid, _ in replies]
            for _, fields in replies:
                pipe.xadd(prefix + "job", fields)
            replies.clear()
            pipe.xack(key, GROUP, *ids)
            pipe.xdel(key, *ids)
            await pipe.execute()

    async def serve(mid: bytes, fields: dict[bytes, bytes]) -> None:
        elapsed = 0.0
        if site:
            t = time.perf_counter()
            async with session.get(f"{site}/p/{int(fields[b'h']) % mod}") as resp:
                await resp.read()
            elapsed = time.perf_counter() - t
        replies.append((mid, {"h": fields[b"h"], "e": repr(elapsed)}))
        if not flusher or flusher[0].done():
            flusher[:] = [asyncio.create_task(flush())]

    tasks: set[asyncio.Task[None]] = set()
    while True:
        got = await r.xreadgroup(GROUP, "w", {key: ">"}, count=64, block=1000)
        for _, entries in got or ():
            for mid, fields in entries:
                task = asyncio.create_task(serve(mid, fields))
                tasks.add(task)
                task.add_done_callback(tasks.discard)


async def job(url: str, prefix: str, pages: int, rate: float, window: int = 0,
              mark: Callable[[], None] | None = None) -> tuple[list[float], float]:
    """The paced job (or with ``rate`` 0 the full-rate one, ``window`` requests in
    flight): each request's round trip in seconds (after 200 sent one by one), and the
    seconds the timed requests took. ``mark()`` is called as the timing starts and as it
    ends."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    jobs = prefix + "job"
    await _group(r, jobs)
    waiting: dict[bytes, asyncio.Future[float]] = {}
    lat: list[float] = []

    async def reader() -> None:
        done: list[bytes] = []
        while True:
            pipe = r.pipeline(transaction=False)
            if done:
                pipe.xack(jobs, GROUP, *done)
                pipe.xdel(jobs, *done)
            pipe.xreadgroup(GROUP, "job", {jobs: ">"}, count=1000, block=500)
            got = (await pipe.execute())[-1]
            done = []
            for _, entries in got or ():
                for mid, fields in entries:
                    done.append(mid)
                    fut = waiting.pop(fields[b"h"], None)
                    if fut is not None:
                        fut.set_result(time.perf_counter() - float(fields[b"e"]))

    queued: list[bytes] = []
    flusher: list[asyncio.Task[None]] = []

    async def flush() -> None:  # the sends of one loop turn in one pipeline (as Outbox)
        while queued:
            pipe = r.pipeline(transaction=False)
            for key in queued:
                pipe.xadd(prefix + "req", {"h": key})
            queued.clear()
            await pipe.execute()

    async def one(i: int) -> None:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        key = str(i).encode()
        waiting[key] = fut
        t = time.perf_counter()
        queued.append(key)
        if not flusher or flusher[0].done():
            flusher[:] = [asyncio.create_task(flush())]
        lat.append(await fut - t)

    task = asyncio.create_task(reader())
    try:
        for i in range(200):
            await one(-1 - i)
        lat.clear()
        if mark is not None:
            mark()
        start = time.perf_counter()
        if rate:
            await paced(pages, rate, one)
        else:
            await full(pages, window, one)
        seconds = time.perf_counter() - start
        if mark is not None:
            mark()
        await r.xadd(prefix + "req", {"h": "stop"})
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await r.aclose()
    return lat, seconds


async def full(n: int, window: int, one: Callable[[int], Awaitable[None]]) -> None:
    """``one(0)`` ... ``one(n - 1)`` by ``window`` senders, each starting its next when
    its last is done (``window`` in flight, as the center row's job keeps them)."""
    todo = iter(range(n))

    async def sender() -> None:
        for i in todo:
            await one(i)

    await asyncio.gather(*[sender() for _ in range(window)])


async def paced(n: int, rate: float, one: Callable[[int], Awaitable[None]]) -> None:
    """``one(0)`` ... ``one(n - 1)`` started at a steady ``rate`` per second (each on
    time, however long the others take), then all awaited."""
    start = time.perf_counter()
    tasks = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)


def run(url: str, pages: int, rate: float, site: str = "", *, workers: int = 2,
        window: int = 0,
        probe: Callable[[dict[str, list[int]]], None] | None = None,
        ) -> tuple[list[float], float]:
    """Start the relay and ``workers`` workers, run the job here (paced at ``rate``/s,
    or with ``rate`` 0 at full rate with ``window`` in flight, the workers then fetching
    ``/p/0`` .. ``/p/pages-1``); the round trips minus the fetches (s) and the timed
    run's seconds. ``probe`` gets the processes' ids ({"relay": [...], "workers": [...]})
    as the timing starts and as it ends."""
    prefix = f"bench-floor-{uuid.uuid4().hex[:8]}:"
    mod = 1000 if rate else pages
    roles = ["relay"] + [f"w{n}" for n in range(workers)]
    procs = [subprocess.Popen([sys.executable, __file__, role, "--redis", url,
                               "--prefix", prefix, "--site", site,
                               "--workers", str(workers), "--mod", str(mod)],
                              stderr=subprocess.DEVNULL)
             for role in roles]
    pids = {"relay": [procs[0].pid], "workers": [p.pid for p in procs[1:]]}
    mark = None if probe is None else (lambda: probe(pids))
    try:
        time.sleep(1.0)
        return asyncio.run(job(url, prefix, pages, rate, window, mark))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        import redis

        client = redis.Redis.from_url(url)
        client.delete(*[prefix + k for k in ("req", "job", *roles[1:])])
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", help="job, relay, or w<n> (worker n)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="Requests/s of the paced job; 0: full rate (--window).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--window", type=int, default=0,
                        help="Full rate: requests in flight (default 2 x 64 x workers).")
    parser.add_argument("--mod", type=int, default=1000,
                        help="A worker fetches /p/<request %% mod>.")
    parser.add_argument("--site", default="", help="The site's base URL (pages /p/<n>).")
    args = parser.parse_args()
    if args.role == "relay":
        asyncio.run(relay(args.redis, args.prefix, args.workers))
    elif args.role[:1] == "w" and args.role[1:].isdigit():
        asyncio.run(worker(args.redis, args.prefix, int(args.role[1:]), args.site, args.mod))
    elif args.role == "job":
        window = args.window or 2 * 64 * args.workers
        lat, seconds = run(args.redis, args.pages, args.rate, args.site,
                           workers=args.workers, window=window)
        lat.sort()
        pct = {q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 for q in (0.5, 0.99)}
        what = (f"paced {args.rate:,.0f}/s:" if args.rate else
                f"full rate, {args.workers} workers, {window} in flight:"
                f" {args.pages / seconds:,.0f}/s,")
        print(f"floor, {what} p50 {pct[0.5]:.2f} ms, p99 {pct[0.99]:.2f} ms")
    else:
        parser.error(f"unknown role {args.role!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Recrawl: ``crawlhub crawl --recrawl`` of a site where 5% of the pages changed, against
the full crawl of the same site (the peer: what a recrawl costs without validators), and
Scrapy with ``HttpCacheMiddleware`` + ``RFC2616Policy`` doing the same full and recrawl.

The site (this script with ``--serve``, in its own process) is ``bench/crawl_site.py``'s
graph (N pages, 10 links each, padded to ``--page-kb``) with an ``ETag`` (a hash of the page),
``Last-Modified`` and ``Cache-Control: max-age=0`` (so a cache must revalidate; Scrapy's
RFC2616Policy never revalidates a ``no-cache`` answer, it fetches it whole) on every
page, answering ``304`` to a matching ``If-None-Match`` / ``If-Modified-Since``. Its
``epoch`` 1 changes every 20th page (5%). It counts the bytes it sends (status line,
headers and bodies) and the 304s; each crawler runs as a child process. Its answers
leave through one uplink of ``--mbps`` (a remote site: what a conditional request saves
is transfer; on an unlimited localhost link, ``--mbps 0``, a 304 costs about what a 200
does and only the bytes shrink).

Claims: the recrawl transfers <= 10% of the full crawl's bytes and runs >= 5x faster.

Run:  python bench/recrawl.py [--pages 20000] [--only crawlhub,scrapy] [--page-kb 12]
      [--mbps 50]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
CONCURRENCY = 64
#: every CHANGE_EVERY-th page changes in epoch 1: 5%
CHANGE_EVERY = 20

SPIDER = '''
import scrapy

class Site(scrapy.Spider):
    name = "site"
    start_urls = [{start!r}]

    def parse(self, response):
        yield {{"url": response.url, "title": response.css("title::text").get()}}
        yield from response.follow_all(css="a")
'''


# ----------------------------------------------------------------------------- the site
def serve(pages: int, page_kb: int, mbps: float) -> None:
    from aiohttp import web

    from crawl_site import page  # type: ignore[import-not-found]

    state = {"epoch": 0, "bytes": 0, "requests": 0, "not_modified": 0}
    link = {"free": 0.0}  # when the site's uplink has sent what it was given

    async def transmit(nbytes: int) -> None:
        """Hold the answer until the uplink (``mbps``, shared by every answer) has sent
        its bytes: what a crawl of a remote site waits for."""
        if not mbps:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        link["free"] = max(now, link["free"]) + nbytes * 8 / (mbps * 1e6)
        await asyncio.sleep(link["free"] - now)

    pad = b"<p>" + b"Lorem ipsum dolor sit amet. " * max(0, page_kb * 1024 // 28 - 80) + b"</p>"

    def body_of(i: int) -> bytes:
        text = page(i, pages).replace(b"</body>", pad + b"</body>")
        if state["epoch"] and i % CHANGE_EVERY == 7:
            text = text.replace(b"</title>", b" (changed)</title>")
        return text

    def sent(resp: web.StreamResponse, body: int) -> int:
        # status line, the headers set here, and Date / Server / Content-Length (~90 B)
        head = 17 + sum(len(k) + len(v) + 4 for k, v in resp.headers.items()) + 90
        state["bytes"] += head + body
        state["requests"] += 1
        return head + body

    async def handle(request: web.Request) -> web.Response:
        try:
            i = int(request.match_info["i"])
        except ValueError:
            raise web.HTTPNotFound() from None
        if not 0 <= i < pages:
            raise web.HTTPNotFound()
        body = body_of(i)
        etag = '"' + hashlib.blake2b(body, digest_size=8).hexdigest() + '"'
        changed = state["epoch"] and i % CHANGE_EVERY == 7
        modified = formatdate(1_700_000_000 + (86400 if changed else 0), usegmt=True)
        headers = {"ETag": etag, "Last-Modified": modified, "Cache-Control": "max-age=0"}
        if request.headers.get("If-None-Match") == etag or (
                "If-None-Match" not in request.headers
                and request.headers.get("If-Modified-Since") == modified):
            # RFC 9110 15.4.5: the validators and Cache-Control; no Last-Modified needed
            resp = web.Response(status=304, headers={"ETag": etag,
                                                     "Cache-Control": "max-age=0"})
            state["not_modified"] += 1
            await transmit(sent(resp, 0))
            return resp
        resp = web.Response(body=body, content_type="text/html", charset="utf-8",
                            headers=headers)
        await transmit(sent(resp, len(body)))
        return resp

    async def control(request: web.Request) -> web.Response:
        if "epoch" in request.query:
            state["epoch"] = int(request.query["epoch"])
        out = dict(state)
        if "reset" in request.query:
            state.update(bytes=0, requests=0, not_modified=0)
        return web.json_response(out)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/p/{i}", handle)
        app.router.add_get("/_control", control)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        print(f"ready {runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def control(base: str, **query: object) -> dict[str, int]:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    with urllib.request.urlopen(f"{base}/_control?{q}") as r:  # noqa: S310 - 127.0.0.1
        return json.loads(r.read())  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- the runs
@dataclass
class Run:
    crawler: str
    phase: str
    seconds: float
    bytes: int
    requests: int
    not_modified: int
    rows: int
    rc: int


def run_child(crawler: str, phase: str, base: str, argv: list[str], out: Path,
              cwd: str | None = None) -> Run:
    control(base, reset=1)
    before = sum(1 for _ in out.open()) if out.exists() else 0
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode:
        print(f"{crawler} {phase} exited {proc.returncode}: {proc.stderr[-500:]}")
    stats = control(base)
    rows = (sum(1 for _ in out.open()) if out.exists() else 0) - before
    return Run(crawler, phase, seconds, stats["bytes"], stats["requests"],
               stats["not_modified"], rows, proc.returncode)


def crawlhub(base: str, work: Path, phase: str) -> Run:
    out = work / "crawlhub.jsonl"
    argv = [str(Path(sys.executable).parent / "crawlhub"), "crawl", f"{base}/p/0", "--follow",
            "--concurrency", str(CONCURRENCY), "--out", str(out), "--data-dir",
            str(work / "crawl-data"), "--quiet", "--no-robots"]
    if phase == "recrawl":
        argv.append("--recrawl")
    return run_child("crawlhub crawl", phase, base, argv, out)


def scrapy(base: str, work: Path, phase: str) -> Run:
    spider = work / "spider.py"
    spider.write_text(SPIDER.format(start=f"{base}/p/0"))
    out = work / f"scrapy-{phase}.jsonl"
    argv = [sys.executable, "-m", "scrapy", "runspider", str(spider), "-o",
            f"{out}:jsonlines", "-s", f"CONCURRENT_REQUESTS={CONCURRENCY}",
            "-s", f"CONCURRENT_REQUESTS_PER_DOMAIN={CONCURRENCY}",
            "-s", "AUTOTHROTTLE_ENABLED=False", "-s", "LOG_LEVEL=WARNING",
            "-s", "ROBOTSTXT_OBEY=False", "-s", "TELNETCONSOLE_ENABLED=False",
            "-s", "HTTPCACHE_ENABLED=True",
            "-s", "HTTPCACHE_POLICY=scrapy.extensions.httpcache.RFC2616Policy",
            "-s", f"HTTPCACHE_DIR={work / 'scrapy-cache'}"]
    return run_child("scrapy + HttpCache RFC2616Policy", phase, base, argv, out,
                     cwd=str(work))


def table(runs: list[Run], pages: int, load: str, site: str) -> Table:
    t = Table(title=f"recrawl of a {pages:,}-page site ({site}), {100 // CHANGE_EVERY}%"
              f" changed, concurrency {CONCURRENCY} (load before: {load}; shared machine)")
    for column in ("crawler", "run", "seconds", "requests", "304s", "bytes sent",
                   "items written", "bytes vs its full", "speed vs its full",
                   "bytes vs crawlhub full"):
        t.add_column(column, justify="left" if column in ("crawler", "run") else "right")
    full = {r.crawler: r for r in runs if r.phase == "full"}
    peer = full.get("crawlhub crawl")
    for r in runs:
        mine = full.get(r.crawler)
        t.add_row(r.crawler, r.phase + (f" (exit {r.rc})" if r.rc else ""),
                  f"{r.seconds:.2f}", f"{r.requests:,}", f"{r.not_modified:,}",
                  f"{r.bytes:,}", f"{r.rows:,}",
                  f"{r.bytes / mine.bytes:.1%}" if mine and mine.bytes else "-",
                  f"{mine.seconds / r.seconds:.1f}x" if mine and r.seconds else "-",
                  f"{r.bytes / peer.bytes:.1%}" if peer and peer.bytes else "-")
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=20000)
    parser.add_argument("--only", default="crawlhub,scrapy")
    parser.add_argument("--page-kb", type=int, default=12,
                        help="page size (the web's median HTML page is ~30 KB)")
    parser.add_argument("--mbps", type=float, default=50.0,
                        help="the site's uplink in Mbit/s, shared by its answers"
                             " (0: unlimited, localhost)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.pages, args.page_kb, args.mbps)
        return 0
    only = set(args.only.split(","))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    site = subprocess.Popen([sys.executable, __file__, "--serve", "--pages", str(args.pages),
                             "--page-kb", str(args.page_kb), "--mbps", str(args.mbps)],
                            stdout=subprocess.PIPE, text=True)
    assert site.stdout is not None
    line = site.stdout.readline()
    if not line.startswith("ready"):
        site.kill()
        raise SystemExit(f"the site did not start: {line!r}")
    base = f"http://127.0.0.1:{int(line.split()[1])}"
    runs: list[Run] = []
    try:
        with tempfile.TemporaryDirectory(prefix="recrawl-bench-") as tmp:
            work = Path(tmp)
            for name, crawler in (("crawlhub", crawlhub), ("scrapy", scrapy)):
                if name not in only:
                    continue
                control(base, epoch=0)
                runs.append(crawler(base, work, "full"))
                control(base, epoch=1)
                runs.append(crawler(base, work, "recrawl"))
    finally:
        site.kill()
        site.wait()
    Console(width=200).print(table(runs, args.pages, load,
                                   f"{args.page_kb} KB pages, uplink "
                                   + (f"{args.mbps:g} Mbit/s" if args.mbps else "unlimited")))
    ours = {r.phase: r for r in runs if r.crawler == "crawlhub crawl"}
    if "full" in ours and "recrawl" in ours:
        f, r = ours["full"], ours["recrawl"]
        ok = r.bytes <= 0.10 * f.bytes and f.seconds >= 5 * r.seconds
        print(f"claim (recrawl <= 10% of the bytes, >= 5x faster): "
              f"{r.bytes / f.bytes:.1%} of the bytes, {f.seconds / r.seconds:.1f}x faster:"
              f" {'met' if ok else 'NOT met'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

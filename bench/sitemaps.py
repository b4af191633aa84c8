"""Sitemaps: reading a large sitemap index, crawlhub's streamed reader against Scrapy's
``scrapy.utils.sitemap.Sitemap`` (what ``SitemapSpider`` parses each body with), same run.

A local server (in its own process) serves an index of N/50,000 gzip sitemaps of 50,000
URLs each (the protocol's maximum), every one with a ``<lastmod>``. Each reader runs in a
child process whose CPU time and peak RSS come from ``os.wait4``: crawlhub's
``read_sitemaps`` over HTTP (chunks inflated and parsed as they arrive, entries dropped
once read), and Scrapy's ``Sitemap`` on each body fetched whole and gunzipped (as its
``SitemapSpider`` does), both only counting the URLs.

Run:  python bench/sitemaps.py [--urls 1000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

PER = 50_000

SERVER = r"""
import asyncio, gzip, sys
from aiohttp import web
parts = int(sys.argv[1])

async def main():
    app = web.Application()
    runner = web.AppRunner(app, access_log=None)
    state = {}
    async def index(request):
        port = state["port"]
        body = "".join(f"<sitemap><loc>http://127.0.0.1:{port}/s/{i}.xml.gz</loc></sitemap>"
                       for i in range(parts))
        return web.Response(text='<sitemapindex xmlns="http://www.sitemaps.org/schemas/'
                                 f'sitemap/0.9">{body}</sitemapindex>')
    async def part(request):
        i = int(request.match_info["i"])
        if i not in state:
            port = state["port"]
            state.clear(); state["port"] = port
            state[i] = gzip.compress(("<urlset xmlns='http://www.sitemaps.org/schemas/sitemap/0.9'>"
                + "".join(f"<url><loc>http://127.0.0.1:{port}/p/{i}/{k}</loc>"
                          f"<lastmod>2024-05-01</lastmod></url>" for k in range(50000))
                + "</urlset>").encode(), 1)
        return web.Response(body=state[i], content_type="application/gzip")
    app.router.add_get("/index.xml", index)
    app.router.add_get("/s/{i}.xml.gz", part)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state["port"] = site._server.sockets[0].getsockname()[1]
    print("ready", state["port"], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""

CRAWLHUB = r"""
import asyncio, sys
from crawlhub.agents.sitemaps import http_chunks, read_sitemaps
async def main():
    n = 0
    async for batch in read_sitemaps([sys.argv[1]], fetch=http_chunks("bench")):
        n += len(batch)
    print(n)
asyncio.run(main())
"""

SCRAPY = r"""
import asyncio, gzip, sys
import aiohttp
from scrapy.utils.sitemap import Sitemap
async def main():
    n = 0
    async with aiohttp.ClientSession() as session:
        async with session.get(sys.argv[1]) as r:
            index = Sitemap(await r.read())
        for entry in index:
            async with session.get(entry["loc"]) as r:
                body = await r.read()
            if body[:2] == b"\x1f\x8b":
                body = gzip.decompress(body)
            for url in Sitemap(body):
                n += 1
    print(n)
asyncio.run(main())
"""


def child(name: str, code: str, url: str, work: Path) -> tuple[str, int, float, float, float]:
    script = work / f"{name}.py"
    script.write_text(code)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, _, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    urls = int(out.split()[0]) if out.strip() else 0
    return name, urls, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--urls", type=int, default=1_000_000)
    args = parser.parse_args()
    parts = max(1, args.urls // PER)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="sitemaps-bench-") as tmp:
        work = Path(tmp)
        (work / "server.py").write_text(SERVER)
        server = subprocess.Popen([sys.executable, str(work / "server.py"), str(parts)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline().split()[1])
            url = f"http://127.0.0.1:{port}/index.xml"
            runs = [child("crawlhub read_sitemaps (streamed)", CRAWLHUB, url, work),
                    child("scrapy Sitemap (whole bodies)", SCRAPY, url, work)]
        finally:
            server.kill()
            server.wait()
    t = Table(title=f"an index of {parts} gzip sitemaps, {parts * PER:,} URLs"
              f" (load before: {load})")
    for column in ("reader", "URLs", "seconds", "CPU s", "peak RSS MB", "RSS vs scrapy"):
        t.add_column(column, justify="left" if column == "reader" else "right")
    scrapy_rss = runs[1][4] or 1
    for name, urls, seconds, cpu, rss in runs:
        t.add_row(name, f"{urls:,}", f"{seconds:.1f}", f"{cpu:.1f}", f"{rss:.0f}",
                  f"{rss / scrapy_rss:.2f}x")
    Console(width=160).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())

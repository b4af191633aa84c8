"""The synthetic site of ``bench/crawl.py``: N pages of about 2 KB, 10 links each.

Page ``/p/<i>`` links to its ten children ``10i+1 .. 10i+10`` (those below N) and fills
the rest of its ten links with deterministic pages already reachable, so a crawl from
``/p/0`` reaches every page and sees each about ten times. Run it in its own process:
``python bench/crawl_site.py --pages 20000 --port 8765``; it prints ``ready <port>``.

``--docs DIR`` serves a directory of real HTML instead (the bench's second site: Debian's
python3-doc, ``/usr/share/doc/python3*/html``), files as they are (aiohttp's static
handler, which sends a ``page.html.gz`` beside a missing ``page.html`` gzipped).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

FILLER = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
          "incididunt ut labore et dolore magna aliqua. ") * 12


def links_of(i: int, pages: int) -> list[int]:
    out = [j for j in range(10 * i + 1, 10 * i + 11) if j < pages]
    k = 0
    while len(out) < 10:
        out.append((i * 7919 + k * 104729) % pages)
        k += 1
    return out


def page(i: int, pages: int) -> bytes:
    links = "\n".join(f'<li><a href="/p/{j}">page {j}</a></li>' for j in links_of(i, pages))
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Page {i}</title>"
            f"</head><body><h1>Page {i}</h1><p>{FILLER}</p><ul>\n{links}\n</ul>"
            f"</body></html>").encode()


def make_app(pages: int) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        try:
            i = int(request.match_info["i"])
        except ValueError:
            raise web.HTTPNotFound() from None
        if not 0 <= i < pages:
            raise web.HTTPNotFound()
        return web.Response(body=page(i, pages), content_type="text/html", charset="utf-8")

    app = web.Application()
    app.router.add_get("/p/{i}", handle)
    return app


def docs_app(root: str) -> web.Application:
    app = web.Application()
    app.router.add_static("/", root)
    return app


async def serve(pages: int, port: int, docs: str | None = None) -> None:
    runner = web.AppRunner(docs_app(docs) if docs else make_app(pages), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    actual = runner.addresses[0][1]
    print(f"ready {actual}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=20000)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--docs", help="serve this directory of HTML instead")
    args = parser.parse_args()
    try:
        import uvloop  # type: ignore[import-not-found]
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(args.pages, args.port, args.docs))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

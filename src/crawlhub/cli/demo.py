"""``crawlhub demo``: serve the local demo shop and paged API until Ctrl-C.

Binds to loopback only; ``examples/`` point at it (``{demo_url}``, default
http://127.0.0.1:8600), so the README's commands run on a machine without internet.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from crawlhub.demo import DEFAULT_PORT, DemoConfig, DemoError, parse_latency, run_demo

err = Console(stderr=True)


def demo_command(
    host: Annotated[str, typer.Option(
        help="Loopback address to bind: 127.0.0.1, ::1 or localhost (others are refused).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")
                    ] = DEFAULT_PORT,
    latency: Annotated[str, typer.Option(
        help="Seconds added to every answer: 0.05, or a random range such as 0.01-0.2.")
    ] = "0",
    error_rate: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of answers replaced by a 500 or a 429, e.g. 0.05.")
    ] = 0.0,
    items: Annotated[int, typer.Option(
        min=0, help="News items the API holds at start, dated over the last 30 days.")
    ] = 1000,
    grow_every: Annotated[float, typer.Option(
        min=0.0, help="Seconds between two new news items (0: the total stays fixed).")
    ] = 2.0,
    js_pages: Annotated[int, typer.Option(
        min=1, help="Pages of the JavaScript shop under /js/ (crawl it with --render).")
    ] = 1000,
    seed: Annotated[int, typer.Option(
        help="Seed of the latency and error draws (same seed, same sequence).")] = 0,
) -> None:
    """Serve a local demo shop and paged JSON API.

    The examples/ configs read it; it binds to loopback only and runs until Ctrl-C.
    """
    try:
        config = DemoConfig(items=items, grow_every=grow_every, latency=parse_latency(latency),
                            error_rate=error_rate, seed=seed, js_pages=js_pages)
        run_demo(config, host, port, ready=lambda url: _banner(url, config))
    except DemoError as exc:
        err.print(f"[bold red]error[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _banner(url: str, config: DemoConfig) -> None:
    growth = (f"+1 every {config.grow_every:g}s" if config.grow_every else "fixed total")
    extra = []
    if config.latency[1]:
        low, high = config.latency
        extra.append(f"latency {low:g}-{high:g}s" if high != low else f"latency {low:g}s")
    if config.error_rate:
        extra.append(f"{config.error_rate:.0%} errors (500/429)")
    lines = [
        f"crawlhub demo: {url}" + (f"  ({', '.join(extra)})" if extra else ""),
        f"  shop  {url}/  (robots.txt, urls.txt); written by JavaScript: {url}/js/"
        f" ({config.js_pages} pages)",
        f"  API   {url}/api/news  ({config.items} items, {growth}), /api/news/{{id}},"
        f" /api/orders",
        "  try   crawlhub collect news -c examples/jobs.yaml",
        "Ctrl-C stops it.",
    ]
    err.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)

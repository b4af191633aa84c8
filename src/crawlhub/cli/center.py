"""``crawlhub center``: run a download center alone (``crawlhub serve`` runs one too when
the config's ``center.url`` is set). Run two on one broker for a spare: they share the
work, and killing one changes nothing for a running crawl."""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from crawlhub.cli import ConfigOpt, DataDirOpt, SetOpt, get_config
from crawlhub.core import heap
from crawlhub.core.errors import ConfigError, CrawlhubError
from crawlhub.core.redact import redact_url

err = Console(stderr=True)

CenterOpt = Annotated[str | None, typer.Option(
    "--center", help="The broker (redis://...). Default: the config's center.url.")]


def center_url(cfg: Any, given: str | None) -> str:
    """The broker URL: ``--center``, else ``center.url``; an error naming both if none."""
    url = given or cfg.center.url
    if not url:
        raise ConfigError("no download center: give --center redis://HOST:6379/0 or set"
                          " center.url in the config", key="center.url")
    return str(url)


def center_command(
    center: CenterOpt = None,
    center_id: Annotated[str | None, typer.Option(
        "--id", help="This center's id (default: host and pid).")] = None,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Run a download center: agents for jobs, downloads routed."""
    with heap.starting():  # until the center runs (see crawlhub.core.heap)
        cfg = get_config(config, data_dir, sets)
        try:
            url = center_url(cfg, center)
            asyncio.run(_run(cfg, url, center_id))
        except CrawlhubError as exc:
            err.print(f"[bold red]error[/] {escape(str(exc))}", highlight=False,
                      soft_wrap=True)
            raise typer.Exit(2) from None


async def _run(cfg: Any, url: str, center_id: str | None) -> None:
    from crawlhub.center import DownloadCenter, open_bus
    from crawlhub.core.signing import signer_from_config

    bus = open_bus(url, prefix=cfg.storage.redis_prefix, signer=signer_from_config(cfg))
    from crawlhub.center.center import open_center_registry

    registry = open_center_registry(cfg, url)
    section = cfg.center
    center = DownloadCenter(bus, registry=registry, center_id=center_id,
                            sync_interval=section.sync_interval, dead_after=section.dead_after,
                            claim_after=section.claim_after, max_skew=section.max_skew)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    err.print(f"center {center.center_id}: serving on {redact_url(url)}", highlight=False)
    heap.started()
    try:
        await center.run(stop)
    finally:
        await bus.close()
        if registry is not None:
            await registry.close()

"""``crawlhub agents``: the downloader agents registered on ``storage.agents`` (by
default the hub state's backend), alive or dead, with their last heartbeat."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from crawlhub.cli import ConfigOpt, DataDirOpt, SetOpt, get_config, out, print_json, run
from crawlhub.core.redact import redact_url


def agents_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (the GET /agents/"
                                                          " body) instead of a table.")
                       ] = False,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Registered agents with their liveness and last heartbeat.

    An agent silent for dead_after seconds (11) is dead; it stays listed until the
    registry forgets it (an hour later).
    """
    cfg = get_config(config, data_dir, sets)
    url = cfg.storage.agents_url
    listing = run(_listing(cfg, url))
    if as_json:
        print_json(listing)
        return
    out.print(_table(listing, redact_url(url), time.time()))


async def _listing(cfg: Any, url: str) -> dict[str, Any]:
    """The agents on ``storage.agents`` and, when ``center.url`` is another server, the
    download center's agents there."""
    from crawlhub.agents.registry import listing, open_registry
    from crawlhub.center.center import open_center_registry

    registry = open_registry(url, prefix=cfg.storage.redis_prefix)
    center = cfg.center.url
    more = open_center_registry(cfg, center) if center and center != url else None
    try:
        return await listing(registry, more=[more] if more is not None else [])
    finally:
        await registry.close()
        if more is not None:
            await more.close()


def _table(listing: dict[str, Any], where: str, now: float) -> Table:
    scheme = where.split("://", 1)[0]
    table = Table(title=f"agents on {scheme}: {listing['alive']} alive, {listing['dead']}"
                  " dead", collapse_padding=True,
                  caption=f"dead: silent for {listing['dead_after']:g} s; seen: seconds ago")
    for name, justify in (("agent", "left"), ("host", "left"), ("pid", "right"),
                          ("state", "left"), ("seen", "right"), ("busy", "right"),
                          ("qps", "right"), ("pages", "right"), ("errors", "right"),
                          ("MB", "right"), ("cpu%", "right"), ("queues/jobs", "left")):
        # fold: a cut agent id could not be looked up
        table.add_column(name, justify=justify,  # type: ignore[arg-type]
                         overflow="fold" if name in ("agent", "queues/jobs") else "ellipsis")
    for r in listing["agents"]:
        beats = r["beats"]
        table.add_row(
            escape(r["agent_id"]), escape(r["host"]), str(r["pid"]),
            "alive" if r["alive"] else "[red]dead[/]",
            f"{max(0.0, now - r['last_seen']):.0f}",
            f"{r['in_flight']}/{r['concurrency']}" if beats else "-",
            f"{r['qps']:.1f}" if beats else "-",
            str(r["pages"]), str(r["errors"]),
            f"{r['memory'] / 2**20:.0f}" if beats else "-",
            f"{r['cpu']:.0f}" if beats else "-",
            escape(",".join(r["queues"] or [f"job:{j}" for j in r.get("jobs") or []])))
    return table

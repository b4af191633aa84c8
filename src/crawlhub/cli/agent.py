"""``crawlhub agent``: a downloader agent process on the config's queues (SQLite or Redis).

It leases from the queue outbounds, fetches, extracts, and settles each result in the
shared hub state with an in-process hub (no inbound consumers of its own); links found
(``--extract`` with ``links.follow``, or a task's own ``extract`` rules) are routed through
the hub and its frontier, carrying the task's ``extract``; items go to ``--sink``.
robots.txt is honoured (``--no-robots`` turns that off): each origin's file is fetched
once per hour by one agent and shared on ``storage.agents``; a disallowed URL is not
fetched and its result is 2007. ``--per-domain`` / ``--delay`` (default: the config's
``agent.politeness``) pace each domain across every agent on ``storage.agents`` (the
domain gate, on the same store as robots.txt).
Run as many as you like on one Redis; SIGTERM / Ctrl-C stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console

from crawlhub.cli import ConfigOpt, DataDirOpt, SetOpt, get_config
from crawlhub.errors import ConfigError, CrawlhubError

err = Console(stderr=True)


def agent_command(
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", help="Queue to lease from (repeatable); default: every queue outbound.")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests at once.")] = 64,
    extract: Annotated[Path | None, typer.Option(
        help="YAML file of extraction rules: fields and links (links.follow crawls) for"
             " tasks without rules of their own, and 'rules: {NAME: {fields, links}}',"
             " named sets a task picks with {\"extract\": \"NAME\"}. A task may also"
             " carry its rules inline in 'extract'.")
    ] = None,
    sink: Annotated[str | None, typer.Option(
        help="Where items go, a sink mapping in YAML, e.g. '{type: redis_stream, url:"
             " redis://127.0.0.1:6379/0, stream: items, key: [url]}'.")] = None,
    timeout: Annotated[float, typer.Option(min=0.001, help="Seconds per request.")] = 30.0,
    lease: Annotated[float, typer.Option(
        min=0.1, help="Seconds a leased task stays this agent's; renewed every third of it"
                      " while the agent holds the task, so a killed agent's tasks go to"
                      " another within it.")] = 120.0,
    robots: Annotated[bool, typer.Option(
        "--robots/--no-robots", help="Honour robots.txt: disallowed URLs are not fetched.")
    ] = True,
    per_domain: Annotated[int | None, typer.Option(
        min=0, show_default=False,
        help="Requests at once per domain across every agent on storage.agents (0: no"
             " limit of its own). Default: the config's agent.politeness.per_domain, 0.")
    ] = None,
    delay: Annotated[float | None, typer.Option(
        min=0.0, show_default=False,
        help="Seconds between two request starts on one domain, across every agent on"
             " storage.agents. Default: the config's agent.politeness.delay, 0.")] = None,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Lease URL tasks, fetch them and report results."""
    cfg = get_config(config, data_dir, sets)
    try:
        rules = _extract(extract)
        sink_spec = _sink_spec(sink)
        polite = cfg.agent.politeness
        asyncio.run(_run(cfg, queue, concurrency, rules, sink_spec, timeout, lease, robots,
                         polite.per_domain if per_domain is None else per_domain,
                         polite.delay if delay is None else delay))
    except CrawlhubError as exc:
        err.print(f"[bold red]error[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _extract(path: Path | None) -> Any:
    from crawlhub.agents.extract import RuleSets
    from crawlhub.cli.crawl import read_extract

    if path is None:
        return RuleSets()
    return RuleSets.from_config(read_extract(path), file=str(path))


def _sink_spec(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--sink: not a YAML mapping ({exc})", key="sink") from None
    if not isinstance(spec, dict):
        raise ConfigError("--sink: expected a mapping such as '{type: jsonl, path: items.jsonl,"
                          " key: [url]}'", key="sink")
    return spec


async def _run(cfg: Any, names: list[str] | None, concurrency: int, rules: Any,
               sink_spec: dict[str, Any] | None, timeout: float, lease: float,
               robots: bool = True, per_domain: int = 0, delay: float = 0.0) -> None:
    from crawlhub.agents.agent import Agent, HubReport, Page, link_tasks
    from crawlhub.agents.crawl import Seen
    from crawlhub.agents.downloader import Downloader, DownloaderConfig
    from crawlhub.config.sinks import build_sink
    from crawlhub.service import Services

    services = await Services.open(cfg)
    hub = services.hub
    hub.sources = {}  # this process settles results; inbound consumers run in `serve`
    inbound = next((i.name for i in cfg.inbound if i.class_ == "http"),
                   cfg.inbound[0].name if cfg.inbound else None)
    if inbound is None:
        await services.close()
        raise ConfigError("the agent reports results through an inbound; add one, e.g."
                          " {name: http, class: http}", key="inbound")
    if not names:
        names = [str(ob.init.get("key") or ob.name) for ob in cfg.outbound
                 if ob.class_ == "queue" and not ob.disable]
    if not names:
        await services.close()
        raise ConfigError("no queue to lease from: give --queue NAME or configure a queue"
                          " outbound", key="outbound")
    sink = build_sink(sink_spec, config=cfg.settings, name="items") if sink_spec else None
    if sink is not None:
        await sink.open()

    seen = Seen()

    async def on_pages(pages: list[Page]) -> None:
        links: dict[str, int] = {}
        items: list[dict[str, Any]] = []
        for page in pages:
            if page.extracted is None:
                continue
            depth = int(page.task.get("depth") or 0) + 1
            for link in page.extracted.links:
                links.setdefault(link, depth)
            items.append({"url": page.task.get("url"), "status": page.fetched.status,
                          "title": page.extracted.title, **page.extracted.fields})
        links = seen.fresh(links)
        if links:
            await hub.submit(link_tasks(links, pages), wait=True)
        if items and sink is not None:
            await sink.write_batch(items)

    downloader = Downloader(DownloaderConfig(concurrency=concurrency, timeout=timeout))
    limits = bool(per_domain or delay)
    gate = (_gate(cfg.storage, downloader, per_domain or concurrency, delay, robots)
            if limits or robots else None)
    agent = Agent({n: services.queues.queue(n) for n in names}, downloader,
                  report=HubReport(hub, inbound), rules=rules, on_pages=on_pages,
                  concurrency=concurrency, registry=services.agents, lease_seconds=lease,
                  gate=gate if limits else None, robots=gate if robots else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await hub.start()
    err.print(f"agent {agent.agent_id}: leasing from {', '.join(names)}", highlight=False)
    try:
        await agent.run(stop)
        await agent.drain()
    finally:
        await downloader.close()
        if gate is not None:
            with contextlib.suppress(Exception):
                await gate.close()
        if sink is not None:
            with contextlib.suppress(Exception):
                await sink.close()
        await services.close()


def _gate(storage: Any, downloader: Any, per_domain: int, delay: float, robots: bool
          ) -> Any:
    """The domain gate on ``storage.agents`` (the registry's backend, under the config's
    Redis prefix), shared by every agent on it: ``per_domain`` requests at once and
    ``delay`` s between starts per domain, and, with ``robots``, the robots.txt cache on
    the same store, fetched with the downloader's User-Agent."""
    from crawlhub.agents.politeness import DomainRules, open_gate

    return open_gate(storage.agents_url, prefix=storage.redis_prefix,
                     rules=DomainRules(concurrency=per_domain, delay=delay), robots=robots,
                     user_agent=downloader.config.user_agent)

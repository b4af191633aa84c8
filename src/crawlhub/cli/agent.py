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
from rich.console import Console
from rich.markup import escape

from crawlhub.cli import ConfigOpt, DataDirOpt, SetOpt, get_config
from crawlhub.core import heap
from crawlhub.core.errors import ConfigError, CrawlhubError
from crawlhub.core.redact import redact_url

err = Console(stderr=True)


def agent_command(
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", help="Queue to lease from (repeatable). Default: the config's"
                        " agent.queues, else every queue outbound.")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(
        min=1, show_default=False,
        help="Requests at once. Default: the config's agent.concurrency, 64.")] = None,
    extract: Annotated[Path | None, typer.Option(
        help="YAML file of extraction rules: fields and links (links.follow crawls) for"
             " tasks without rules of their own, and 'rules: {NAME: {fields, links}}',"
             " named sets a task picks with {\"extract\": \"NAME\"}. A task may also"
             " carry its rules inline in 'extract'.")
    ] = None,
    sink: Annotated[str | None, typer.Option(
        help="Where items go, a sink mapping in YAML, e.g. '{type: redis_stream, url:"
             " redis://127.0.0.1:6379/0, stream: items, key: [url]}'. Default: the"
             " config's agent.sink (none: items are not written).")] = None,
    timeout: Annotated[float | None, typer.Option(
        min=0.001, show_default=False,
        help="Seconds per request. Default: the config's agent.downloader.timeout, 30.")
    ] = None,
    lease: Annotated[float | None, typer.Option(
        min=0.1, show_default=False,
        help="Seconds a leased task stays this agent's; renewed every third of it while"
             " the agent holds the task, so a killed agent's tasks go to another within"
             " it. Default: the config's agent.lease, 120.")] = None,
    robots: Annotated[bool | None, typer.Option(
        "--robots/--no-robots", show_default=False,
        help="Honour robots.txt: disallowed URLs are not fetched. Default: the config's"
             " agent.politeness.robots, on.")] = None,
    per_domain: Annotated[int | None, typer.Option(
        min=0, show_default=False,
        help="Requests at once per domain across every agent on storage.agents (0: no"
             " limit of its own). Default: the config's agent.politeness.per_domain, 0.")
    ] = None,
    delay: Annotated[float | None, typer.Option(
        min=0.0, show_default=False,
        help="Seconds between two request starts on one domain, across every agent on"
             " storage.agents. Default: the config's agent.politeness.delay, 0.")] = None,
    center: Annotated[str | None, typer.Option(
        help="Serve the download center on this broker (redis://...) instead of leasing"
             " from queues: download the jobs' requests the center sends. Default: none"
             " (queues); 'config' takes the config's center.url.")] = None,
    agent_id: Annotated[str | None, typer.Option(
        "--id", help="With --center: this agent's id. Give the same one after a restart"
                     " and it reloads its allocations from the data dir. Default: host"
                     " and pid.")] = None,
    revalidate: Annotated[str | None, typer.Option(
        metavar="FRONTIER",
        help="Conditional recrawl: keep each page's ETag, Last-Modified and body hash in"
             " this frontier's archive, and ask a URL leased again (in a later segment)"
             " with If-None-Match / If-Modified-Since; a 304 or an unchanged body is not"
             " extracted (no item, no links). Default: the config's agent.revalidate.")
    ] = None,
    emit_unchanged: Annotated[bool | None, typer.Option(
        "--emit-unchanged", show_default=False,
        help="With --revalidate: a page whose body did not change is extracted again"
             " (only a 304 is skipped).")] = None,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Lease and fetch URL tasks, or serve the download center."""
    from crawlhub.cli.crawl import read_sink

    with heap.starting():  # until the agent runs (see crawlhub.core.heap)
        cfg = get_config(config, data_dir, sets)
        try:
            rules = _extract(extract)
            settings = agent_settings(cfg.agent, queues=queue, concurrency=concurrency,
                                      sink=read_sink(sink), timeout=timeout, lease=lease,
                                      robots=robots, per_domain=per_domain, delay=delay,
                                      revalidate=revalidate, emit_unchanged=emit_unchanged)
            if center is not None:
                from crawlhub.cli.center import center_url

                url = center_url(cfg, None if center == "config" else center)
                asyncio.run(_serve_center(cfg, settings, url, agent_id))
                return
            asyncio.run(_run(cfg, settings, rules))
        except CrawlhubError as exc:
            err.print(f"[bold red]error[/] {escape(str(exc))}", highlight=False,
                      soft_wrap=True)
            raise typer.Exit(2) from None


def agent_settings(section: Any, *, queues: list[str] | None = None,
                   concurrency: int | None = None, sink: dict[str, Any] | None = None,
                   timeout: float | None = None, lease: float | None = None,
                   robots: bool | None = None, per_domain: int | None = None,
                   delay: float | None = None, revalidate: str | None = None,
                   emit_unchanged: bool | None = None) -> Any:
    """The config's ``agent`` section with the command-line options given laid over it
    (an option left out keeps the config's value)."""
    politeness = section.politeness.model_copy(update={
        k: v for k, v in (("robots", robots), ("per_domain", per_domain), ("delay", delay))
        if v is not None})
    downloader = section.downloader
    if timeout is not None:
        downloader = downloader.model_copy(update={"timeout": timeout})
    update: dict[str, Any] = {"politeness": politeness, "downloader": downloader}
    for name, value in (("queues", queues), ("concurrency", concurrency), ("sink", sink),
                        ("lease", lease), ("revalidate", revalidate)):
        if value:
            update[name] = value
    if emit_unchanged is not None:
        update["emit_unchanged"] = emit_unchanged
    return section.model_copy(update=update)


def _extract(path: Path | None) -> Any:
    from crawlhub.agents.extract import RuleSets
    from crawlhub.cli.crawl import read_extract

    if path is None:
        return RuleSets()
    return RuleSets.from_config(read_extract(path), file=str(path))


async def _run(cfg: Any, settings: Any, rules: Any) -> None:
    """One agent process with ``settings`` (the merged ``agent`` section)."""
    from crawlhub.agents.agent import Agent, CrawledPage, HubReport
    from crawlhub.agents.downloader import Downloader
    from crawlhub.app.crawl import Seen
    from crawlhub.services import Services
    from crawlhub.sinks.config import build_sink

    services = await Services.open(cfg)
    hub = services.hub
    hub.sources = {}  # this process settles results; inbound consumers run in `serve`
    inbound = next((i.name for i in cfg.inbound if i.class_ == "http"),
                   cfg.inbound[0].name if cfg.inbound else None)
    if inbound is None:
        await services.close()
        raise ConfigError("the agent reports results through an inbound; add one, e.g."
                          " {name: http, class: http}", key="inbound")
    names = list(settings.queues) or [
        str(ob.init.get("key") or ob.name) for ob in cfg.outbound
        if ob.class_ == "queue" and not ob.disable]
    if not names:
        await services.close()
        raise ConfigError("no queue to lease from: give --queue NAME or configure a queue"
                          " outbound", key="outbound")
    revalidate = None
    if settings.revalidate:
        frontier = services.frontiers.get(settings.revalidate)
        if frontier is None:
            await services.close()
            raise ConfigError(f"no frontier named {settings.revalidate!r} to keep the"
                              " validators in; configure it under 'frontier'",
                              key="agent.revalidate")
        from crawlhub.frontier.conditional import Revalidation

        revalidate = Revalidation(frontier, skip_unchanged=not settings.emit_unchanged)
    concurrency = settings.concurrency
    sink = build_sink(settings.sink, config=cfg.settings, name="items") \
        if settings.sink else None
    if sink is not None:
        await sink.open()

    seen = Seen()

    async def on_pages(pages: list[CrawledPage]) -> None:
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
        if links:
            await seen.submit(hub, links, pages)
        if items and sink is not None:
            await sink.write_batch(items)

    dl = settings.downloader
    # the connection pool holds at least one connection per request at once
    downloader = Downloader(dl.model_copy(update={"concurrency": max(dl.concurrency,
                                                                      concurrency)}))
    polite = settings.politeness
    limits = bool(polite.per_domain or polite.delay or polite.adaptive)
    gate = (_gate(cfg.storage, downloader.config.user_agent, polite.per_domain or concurrency,
                  polite.delay, polite.robots, polite.adaptive)
            if limits or polite.robots else None)
    agent = Agent({n: services.queues.queue(n) for n in names}, downloader,
                  report=HubReport(hub, inbound), rules=rules, codes=settings.result_codes,
                  on_pages=on_pages, concurrency=concurrency, registry=services.agents,
                  lease_seconds=settings.lease, gate=gate if limits else None,
                  robots=gate if polite.robots else None, render_config=settings.render,
                  revalidate=revalidate)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await hub.start()
    err.print(f"agent {agent.agent_id}: leasing from {', '.join(names)}", highlight=False)
    heap.started()
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


def _gate(storage: Any, user_agent: str, per_domain: int, delay: float, robots: bool,
          adaptive: bool = False) -> Any:
    """The domain gate on ``storage.agents`` (the registry's backend, under the config's
    Redis prefix), shared by every agent on it: ``per_domain`` requests at once and
    ``delay`` s between starts per domain, and, with ``robots``, the robots.txt cache on
    the same store, fetched with ``user_agent``."""
    from crawlhub.agents.politeness import DomainRules, open_gate

    return open_gate(storage.agents_url, prefix=storage.redis_prefix,
                     rules=DomainRules(concurrency=per_domain, delay=delay, adaptive=adaptive,
                                       max_delay=max(60.0, delay)), robots=robots,
                     user_agent=user_agent)


async def _serve_center(cfg: Any, settings: Any, url: str, agent_id: str | None) -> None:
    """One agent of the download center on ``url``: its downloader settings, proxies and
    politeness from ``settings``; allocations kept in the data dir."""
    from crawlhub.center import CenterWorker, open_bus
    from crawlhub.core.signing import signer_from_config

    bus = open_bus(url, prefix=cfg.storage.redis_prefix, signer=signer_from_config(cfg))
    dl = settings.downloader
    config = dl.model_copy(update={"concurrency": max(dl.concurrency, settings.concurrency)})
    polite = settings.politeness
    gate = (_gate(cfg.storage, config.user_agent, polite.per_domain or settings.concurrency,
                  polite.delay, robots=False) if polite.per_domain or polite.delay else None)
    worker = CenterWorker(bus, agent_id, downloader_config=config, gate=gate,
                          concurrency=settings.concurrency,
                          state_dir=cfg.data_dir,
                          idle_release=cfg.center.idle_release,
                          beat_every=cfg.center.beat_every, render_config=settings.render)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    err.print(f"agent {worker.agent_id}: serving the download center on {redact_url(url)}",
              highlight=False)
    heap.started()
    try:
        await worker.run(stop)
    finally:
        if gate is not None:
            with contextlib.suppress(Exception):
                await gate.close()
        await bus.close()

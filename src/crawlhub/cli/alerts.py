"""``crawlhub alerts``: list, add, remove and test alert routes, and show what was sent,
on the control database of the config (``control.url``); a running server picks a change
up with the next event.

    crawlhub alerts add shop-slack --webhook - --job 'shop-*' --event run_failed < url.txt
    crawlhub alerts add ops --email ops@example.com --event agent_dead
    crawlhub alerts test shop-slack

``--webhook -`` reads the URL from stdin, out of the shell's history and ``ps``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from crawlhub.cli import (
    ConfigOpt,
    DataDirOpt,
    JsonOpt,
    SetOpt,
    err,
    fail,
    get_config,
    out,
    print_json,
    run,
)
from crawlhub.control.alerts import EVENT_KINDS, AlertService, AlertSettings, make_spec
from crawlhub.core.errors import CrawlhubError

app = typer.Typer(help="Alert routes per job: webhook or email.\n\nSent on failed, empty"
                  " or overlong runs, dead agents and stalled queues; a Slack-compatible"
                  " webhook or an email over SMTP (control.smtp_url).",
                  no_args_is_help=True)
T = TypeVar("T")



@asynccontextmanager
async def _alerts(cfg: Any) -> AsyncIterator[AlertService]:
    """An AlertService on the config's control database, with the server's secret key."""
    from crawlhub.control.db import ControlDB
    from crawlhub.control.secrets import SecretBox

    secrets = SecretBox.from_config(cfg)
    settings = AlertSettings.from_section(cfg.control)
    db = await ControlDB.open(cfg.control.url)
    try:
        service = await AlertService.open(db, secrets, settings)
        try:
            yield service
        finally:
            await service.close(grace=settings.timeout * 3)
    finally:
        await db.close()


def _call(cfg: Any, fn: Callable[[AlertService], Awaitable[T]]) -> T:
    async def go() -> T:
        async with _alerts(cfg) as alerts:
            return await fn(alerts)

    return run(go())  # type: ignore[no-any-return]


@app.command("list")
def list_command(as_json: JsonOpt = False, config: ConfigOpt = None,
                 data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """List the alert routes.

    Webhook URLs are shown as scheme://host/*** only.
    """
    cfg = get_config(config, data_dir, sets)
    routes = _call(cfg, lambda alerts: alerts.routes())
    if as_json:
        print_json([r.as_dict() for r in routes])
        return
    table = Table(title=f"{len(routes)} alert routes", collapse_padding=True)
    for col in ("name", "kind", "target", "events", "jobs", "queues", "enabled"):
        table.add_column(col, overflow="fold")
    for r in routes:
        events = "all" if set(r.events) == set(EVENT_KINDS) else ", ".join(r.events)
        table.add_row(escape(r.name), r.kind, escape(r.target), events,
                      escape(", ".join(r.jobs) or "all"), escape(", ".join(r.queues) or "all"),
                      "yes" if r.enabled else "no")
    out.print(table)


@app.command("add")
def add_command(
    name: Annotated[str, typer.Argument(help="The route's name.")],
    webhook: Annotated[str | None, typer.Option(
        help="A webhook URL (Slack incoming webhook, Mattermost, ...); '-' reads it from"
        " stdin.")] = None,
    email: Annotated[list[str] | None, typer.Option(
        "--email", help="An email address (repeat for more).")] = None,
    events: Annotated[list[str] | None, typer.Option(
        "--event", help=f"An event to send (repeat; default all): {', '.join(EVENT_KINDS)}."
    )] = None,
    jobs: Annotated[list[str] | None, typer.Option(
        "--job", help="A job name or glob pattern for run events (repeat; default all).")
    ] = None,
    queues: Annotated[list[str] | None, typer.Option(
        "--queue", help="A queue name or glob pattern for queue_stalled (repeat; default"
        " all).")] = None,
    disabled: Annotated[bool, typer.Option(help="Store it muted.")] = False,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Add an alert route.

    Give --webhook URL (or - to read it from stdin) or --email ADDRESS.
    """
    cfg = get_config(config, data_dir, sets)
    if (webhook is None) == (not email):
        err.print("error: give either --webhook URL or --email ADDRESS", highlight=False)
        raise typer.Exit(2)
    if webhook == "-":
        webhook = sys.stdin.readline().strip()
    data: dict[str, Any] = {"name": name, "kind": "webhook" if webhook is not None else "email",
                            "url": webhook, "to": email or [], "jobs": jobs or [],
                            "queues": queues or [], "enabled": not disabled}
    if events:
        data["events"] = events
    try:
        spec = make_spec(data)
    except CrawlhubError as exc:
        fail(exc)
    route = _call(cfg, lambda alerts: alerts.create(spec))
    out.print(f"alert route {escape(route.name)}: {route.kind} to {escape(route.target)}",
              highlight=False)


@app.command("remove")
def remove_command(name: Annotated[str, typer.Argument(help="The route's name.")],
                   config: ConfigOpt = None, data_dir: DataDirOpt = None,
                   sets: SetOpt = None) -> None:
    """Remove an alert route.

    What it sent stays in the delivery log.
    """
    cfg = get_config(config, data_dir, sets)
    _call(cfg, lambda alerts: alerts.delete(name))
    out.print(f"alert route {escape(name)} removed", highlight=False)


@app.command("test")
def test_command(name: Annotated[str, typer.Argument(help="The route's name.")],
                 as_json: JsonOpt = False, config: ConfigOpt = None,
                 data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """Send a test message now.

    Exits 1 if the target did not take it, printing why.
    """
    cfg = get_config(config, data_dir, sets)
    result = _call(cfg, lambda alerts: alerts.test(name))
    if as_json:
        print_json(result.as_dict())
    elif result.ok:
        out.print(f"sent: {escape(result.answer)} ({result.elapsed:.2f} s)", highlight=False)
    else:
        err.print(f"failed: {escape(result.error)}", highlight=False, soft_wrap=True)
    if not result.ok:
        raise typer.Exit(1)


@app.command("deliveries")
def deliveries_command(
    route: Annotated[str | None, typer.Option(help="Only this route's.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job's.")] = None,
    limit: Annotated[int, typer.Option("-n", min=1, max=1000,
                                       help="How many at most.")] = 20,
    as_json: JsonOpt = False, config: ConfigOpt = None, data_dir: DataDirOpt = None,
    sets: SetOpt = None,
) -> None:
    """Alerts sent or failed, newest first."""
    cfg = get_config(config, data_dir, sets)
    rows = _call(cfg, lambda alerts: alerts.deliveries(route=route, job=job, limit=limit))
    if as_json:
        print_json([d.as_dict() for d in rows])
        return
    table = Table(title=f"{len(rows)} deliveries", collapse_padding=True)
    for col in ("time", "route", "event", "about", "status", "answer / error"):
        table.add_column(col, overflow="fold")
    for d in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.ts))
        table.add_row(when, escape(d.route), d.event, escape(d.about),
                      d.status if d.status == "sent" else f"[red]{d.status}[/]",
                      escape(d.answer if d.status == "sent" else d.error))
    out.print(table)

"""``crawlhub logs``: search the log store of the config (``control.logs_url``), follow
it, and apply retention; reads the store directly, no server needed.

    crawlhub logs --job news --level warning -q 'timeout -proxy' --since 2h
    crawlhub logs --run r-20240501-1 --follow
    crawlhub logs prune --max-age 7d
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import typer

from crawlhub.cli import ConfigOpt, DataDirOpt, SetOpt, get_config, run
from crawlhub.control.logs import (
    LogLine,
    LogQuery,
    LogQueryError,
    LogService,
    LogStore,
    open_log_store,
    parse_when,
)
from crawlhub.core.durations import parse_duration

app = typer.Typer(help="Search, follow and prune the log store.\n\nEvery run's output and"
                  " the logs of the hub, agents, collectors and the center.",
                  invoke_without_command=True)


@asynccontextmanager
async def _store(cfg: Any) -> AsyncIterator[LogStore]:
    from crawlhub.control.db import ControlDB

    store = open_log_store(await ControlDB.open(cfg.control.logs_url))
    try:
        await store.open()
        yield store
    finally:
        await store.close()


def format_line(line: LogLine) -> str:
    """``2024-05-01 12:00:03.250 ERROR job/run/task [source] message`` (UTC)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(line.ts))
    millis = int((line.ts % 1) * 1000)
    codes = "/".join(c for c in (line.job, line.run, line.task) if c) or "-"
    return f"{stamp}.{millis:03d} {line.level.upper():8} {codes} [{line.source}] {line.message}"


def _print(line: LogLine, as_json: bool) -> None:
    typer.echo(json.dumps(line.to_dict(), ensure_ascii=False) if as_json
               else format_line(line))


@app.callback(invoke_without_command=True)
def logs(
    ctx: typer.Context,
    job: Annotated[str | None, typer.Option(help="Only lines of this job.")] = None,
    run_code: Annotated[str | None, typer.Option("--run", help="Only lines of this run.")
                        ] = None,
    task: Annotated[str | None, typer.Option(help="Only lines of this task.")] = None,
    level: Annotated[str | None, typer.Option(
        help="The lowest level: debug, info, warning, error, critical.")] = None,
    source: Annotated[str | None, typer.Option(
        help="Only lines from job, build, hub, agent, collector, center or control.")
                      ] = None,
    query: Annotated[str | None, typer.Option(
        "-q", "--query", help="Search text: words, \"a phrase\", prefix*, -excluded.")
                     ] = None,
    since: Annotated[str | None, typer.Option(
        help="Lines at or after: unix seconds, ISO 8601 (UTC without an offset) or an age"
        " (15m, 2h, 7d).")] = None,
    until: Annotated[str | None, typer.Option(help="Lines before (like --since).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10000,
                                       help="How many of the newest matches.")] = 100,
    follow: Annotated[bool, typer.Option("--follow", "-f",
                                         help="Then print new lines as they come, until"
                                         " Ctrl-C.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")
                       ] = False,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Print the newest matching lines, oldest of them first (like tail); --follow keeps
    printing new ones."""
    ctx.obj = {"config": config, "data_dir": data_dir, "sets": sets}
    if ctx.invoked_subcommand is not None:
        return
    cfg = get_config(config, data_dir, sets)
    try:
        q = LogQuery(job=job, run=run_code, task=task, level=level, source=source,
                     q=query, since=parse_when(since, name="--since"),
                     until=parse_when(until, name="--until"), limit=limit)
    except LogQueryError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        run(_show(cfg, q, follow, as_json))
    except KeyboardInterrupt:
        pass


async def _show(cfg: Any, query: LogQuery, follow: bool, as_json: bool) -> None:
    async with _store(cfg) as store:
        page = await store.search(query)
        for line in reversed(page.lines):
            _print(line, as_json)
        if not follow:
            return
        # From the newest line shown (or, none shown, from now), with the same filters
        # but no time bounds: those were for the history. Only the service's tail is used.
        tail = LogQuery(job=query.job, run=query.run, task=query.task, level=query.level,
                        source=query.source, q=query.q)
        after = page.lines[0].id if page.lines else None
        async for line in LogService(store).tail(tail, after=after):
            _print(line, as_json)


@app.command("prune")
def prune(
    ctx: typer.Context,
    max_age: Annotated[str | None, typer.Option(
        help="Delete lines older than this: seconds or an age (7d, 12h); default"
        " control.log_max_age.")] = None,
    max_lines: Annotated[int | None, typer.Option(
        min=0, help="Then keep at most this many lines; default control.log_max_lines.")
                         ] = None,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Apply retention now (crawlhub serve does it every few minutes)."""
    parent = ctx.obj or {}
    cfg = get_config(config or parent.get("config"), data_dir or parent.get("data_dir"),
                     sets or parent.get("sets"))
    age = float(cfg.control.log_max_age)
    if max_age is not None:
        try:
            age = parse_duration(max_age)
        except ValueError as exc:
            raise typer.BadParameter(f"--max-age: {exc}") from None
    lines = cfg.control.log_max_lines if max_lines is None else max_lines
    removed, left = run(_prune(cfg, age, lines))
    typer.echo(f"deleted {removed} lines; {left} left")


async def _prune(cfg: Any, max_age: float, max_lines: int) -> tuple[int, int]:
    async with _store(cfg) as store:
        removed = await store.prune(max_age=max_age, max_lines=max_lines)
        return removed, await store.count()


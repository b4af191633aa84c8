"""``crawlhub runs``: the run history of every job (newest first) and one run's task
timeline."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from crawlhub.cli import ConfigOpt, DataDirOpt, JsonOpt, SetOpt, get_config, out, print_json, when
from crawlhub.cli.jobs import _call

app = typer.Typer(help="Runs of jobs, newest first, and their tasks.",
                  no_args_is_help=True)


@app.command("list")
def list_command(job: Annotated[str | None, typer.Option(help="Only this job's runs.")] = None,
                 status: Annotated[list[str] | None, typer.Option(help="running, failed, ...")
                                   ] = None,
                 before: Annotated[str | None, typer.Option(help="Page before this run id.")
                                   ] = None,
                 limit: Annotated[int, typer.Option(min=1, max=1000, help="Runs a page.")] = 50,
                 as_json: JsonOpt = False, config: ConfigOpt = None,
                 data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """Runs, newest first."""
    cfg = get_config(config, data_dir, sets)
    runs = _call(cfg, lambda jobs: jobs.runs(job=job, status=status or [], before=before,
                                            limit=limit))
    if as_json:
        print_json([r.model_dump() for r in runs])
        return
    table = Table(title=f"{len(runs)} runs", collapse_padding=True)
    for col in ("run", "job", "status", "trigger", "started", "seconds", "exit", "error"):
        table.add_column(col)
    for r in runs:
        took = f"{r.duration:.1f}" if r.duration is not None else "-"
        table.add_row(r.id, escape(r.job), r.status, r.trigger, when(r.started_at), took,
                      str(r.exit_code) if r.exit_code is not None else "-",
                      escape((r.error or "")[:60]))
    out.print(table)


@app.command("show")
def show_command(run_id: Annotated[str, typer.Argument(help="The run's id.")], as_json: JsonOpt = False, config: ConfigOpt = None,
                 data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """A run with its counters, queue figures and task timeline."""
    cfg = get_config(config, data_dir, sets)
    view = _call(cfg, lambda jobs: jobs.run_view(run_id))
    if as_json:
        print_json(view.model_dump())
        return
    r = view.run
    out.print(f"[bold]{r.id}[/] job {escape(r.job)}: {r.status} ({r.trigger}) host"
              f" {escape(r.host)} pid {r.pid}")
    out.print(f"started {when(r.started_at)}  ended {when(r.finished_at)}  exit"
              f" {r.exit_code if r.exit_code is not None else '-'}"
              + (f"  error: {escape(r.error)}" if r.error else ""))
    if r.counters:
        out.print("counters: " + "  ".join(f"{escape(str(k))} {v}" for k, v in
                                           sorted(r.counters.items())))
    for t in view.tasks:
        took = f"{t.finished_at - t.started_at:.2f}s" if t.finished_at else "running"
        out.print(f"  {escape(t.task):<30} {t.status:<10} {took}"
                  + (f"  {escape(t.detail)}" if t.detail else ""))


@app.command("cancel")
def cancel_command(run_id: Annotated[str, typer.Argument(help="The run's id.")],
                   wait: Annotated[float, typer.Option(
                       min=0, max=300, help="Seconds to wait for it to end.")] = 0,
                   config: ConfigOpt = None, data_dir: DataDirOpt = None,
                   sets: SetOpt = None) -> None:
    """Cancel one run, the job's other runs left alone.

    SIGTERM, then SIGKILL after the grace period; the server running it hears of it
    within a second. 'crawlhub jobs cancel NAME' stops all of a job's runs."""
    cfg = get_config(config, data_dir, sets)
    r = _call(cfg, lambda jobs: jobs.cancel_run(run_id, wait=wait or None))
    out.print(f"run {r.id} of job {escape(r.job)}: "
              + (r.status if r.status not in ("queued", "running") else
                 f"asked to stop (still {r.status})"))

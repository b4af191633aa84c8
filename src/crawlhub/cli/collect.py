"""``crawlhub collect NAME``: run one collection job in the foreground with a progress bar.

Prints the RunResult; Ctrl-C cancels gracefully (what was processed is written and
progress saved), a second Ctrl-C aborts. Exit code 0 succeeded, 1 failed, 2 bad input,
3 the job is already running elsewhere (its lease names pid and host), 130 cancelled.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from crawlhub import sdk
from crawlhub.collect.build import new_run
from crawlhub.collect.lease import DEFAULT_LEASE_TTL, JobRunning
from crawlhub.collect.service import metadata_url_for
from crawlhub.collect.store import open_metadata_store
from crawlhub.core import heap
from crawlhub.core.errors import ConfigError, CrawlhubError
from crawlhub.fetch.cancel import CancellationToken, ctrl_c_cancels
from crawlhub.pipeline.config import cli_overrides
from crawlhub.pipeline.progress import show_progress
from crawlhub.pipeline.result import RunResult, Status

out = Console()
err = Console(stderr=True)


def collect_command(
    name: Annotated[str, typer.Argument(help="The job's name (jobs[].name in the config).")],
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", envvar="CRAWLHUB_CONFIG", help="YAML config file with 'jobs:'."
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", envvar="CRAWLHUB_DATA_DIR", help="Where embedded data lives."),
    ] = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", help="Setting name=value (highest layer).")
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option("--metadata", help="Metadata store URL (default: storage.metadata)."),
    ] = None,
    pipeline_workers: Annotated[int | None, typer.Option(
        "--pipeline-workers", help="Processing workers (pipeline.workers, default 2).")] = None,
    pipeline_batch_size: Annotated[int | None, typer.Option(
        "--pipeline-batch-size", help="Records per sink batch (pipeline.batch_size, default 100).")
    ] = None,
    pipeline_rate_min: Annotated[float | None, typer.Option(
        "--pipeline-rate-min", help="Shortest gap in seconds between two requests (rate_min).")
    ] = None,
    pipeline_rate_max: Annotated[float | None, typer.Option(
        "--pipeline-rate-max", help="Longest gap in seconds between two requests (rate_max).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the RunResult as JSON.")] = False,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar on stderr.")
    ] = True,
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            min=0.1,
            help="Seconds the run's lease outlives a missed heartbeat (renewed every third "
            "of it); a stop requested over the API arrives within a third of it.",
        ),
    ] = DEFAULT_LEASE_TTL,
) -> None:
    """Run one collection job now and print its result.

    Runs in the foreground with a progress bar; Ctrl-C stops it gracefully, a second
    Ctrl-C aborts. Prints the RunResult (--json for JSON).
    """
    from crawlhub.cli import get_config

    cfg = get_config(config, data_dir, sets)
    job = next((j for j in cfg.jobs if j.name == name), None)
    if job is None:
        known = ", ".join(j.name for j in cfg.jobs) or "none configured"
        err.print(f"no job named {name!r} in the config; known jobs: {known}", highlight=False)
        raise typer.Exit(2)
    cli = cli_overrides(pipeline_workers, pipeline_batch_size, pipeline_rate_min, pipeline_rate_max)
    token = CancellationToken()
    heap.started()  # the collector as the other long-running commands run it
    try:
        with ctrl_c_cancels(token):
            result = asyncio.run(
                _collect(cfg, job.name, metadata or metadata_url_for(cfg), token, cli, progress,
                         lease_ttl)
            )
    except JobRunning as exc:
        err.print(f"[bold red]error[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(3) from None
    except KeyboardInterrupt:
        err.print(
            "aborted (second Ctrl-C): the run's progress was saved up to the last delivered batch"
        )
        raise typer.Exit(130) from None
    except (ConfigError, CrawlhubError, ValueError) as exc:
        err.print(f"[bold red]error[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        out.print_json(json.dumps(result.to_dict()))
    else:
        print_result(result, out)
    if result.status is Status.FAILED:
        raise typer.Exit(1)
    if result.status is Status.CANCELLED:
        raise typer.Exit(130)


async def _collect(
    cfg: Any,
    name: str,
    url: str,
    token: CancellationToken,
    cli: dict[str, Any],
    progress: bool,
    lease_ttl: float = DEFAULT_LEASE_TTL,
) -> RunResult:
    job = next(j for j in cfg.jobs if j.name == name)
    store = await open_metadata_store(url)
    try:
        # under a job runner: its control file pauses / ends the run, its counters file
        # gets the run's requests, items and errors
        under = sdk.under_runner()
        run = new_run(job, store=store, config=cfg, token=token, cli=cli, lease_ttl=lease_ttl,
                      control=sdk.control() if under else None,
                      counters=sdk.process_counters() if under else None)
        await run.claim()  # before the progress bar: a conflict is one clear line
        if not progress:
            return await run.run()
        return await show_progress(lambda: [run.progress()], run.run(), console=err)
    finally:
        await store.close()


def print_result(result: RunResult, console: Console) -> None:
    """The RunResult as a summary line and a table of counts."""
    # markup off: an error text such as "pip install 'crawlhub[postgres]'" is not markup
    console.print(result.summary(), highlight=False, markup=False, soft_wrap=True)
    data = result.to_dict()
    table = Table(show_header=True, header_style="bold")
    table.add_column("stage")
    table.add_column("counts")
    for key in ("requests", "records", "batches", "detail"):
        table.add_row(key, ", ".join(f"{k} {v}" for k, v in data[key].items()))
    table.add_row("timings", ", ".join(f"{k} {v:.3f}s" for k, v in data["timings"].items()))
    for stage, counts in data["error_counts"].items():
        table.add_row(f"errors/{stage}",
                      escape("; ".join(f"{n}x {e}" for e, n in counts.items())))
    console.print(table)

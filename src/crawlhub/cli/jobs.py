"""``crawlhub jobs``: list, add, show, change, remove, run, pause, continue, cancel and
restart jobs on the control database of the config (``control.url``).

``crawlhub jobs run NAME`` runs the job here, in the foreground, printing its log lines,
and exits with 0 when the run succeeded; with ``--server URL`` it asks a running
``crawlhub serve`` instead (``POST /jobs/NAME/run``). Pause, continue and cancel store
the desired state: the runner (here or in a server) follows it within seconds.
"""

from __future__ import annotations

import asyncio
import json
import sys
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
    get_config,
    out,
    print_json,
    run,
    when,
)
from crawlhub.control.jobs import JobPatch, JobService, JobSpec, RunRecord
from crawlhub.control.logs.line import LogLine

app = typer.Typer(help="Jobs of every kind: subprocess, crawl, collect.",
                  no_args_is_help=True)
T = TypeVar("T")

NameArg = Annotated[str, typer.Argument(help="The job's name.")]
# where a run runs (jobs add / set); checked by JobSpec as the API checks them
RuntimeOpt = Annotated[str | None, typer.Option(
    help="process or container (default: the server's control.runtime).")]
ImageOpt = Annotated[str | None, typer.Option(
    help="Container runtime: the image to run (default: the project's build image).")]
CpusOpt = Annotated[float | None, typer.Option(help="Container runtime: CPUs, e.g. 1.5.")]
MemoryOpt = Annotated[str | None, typer.Option(
    help="Container runtime: memory, e.g. 256m or 2g (no swap).")]
PidsOpt = Annotated[int | None, typer.Option(help="Container runtime: most processes at once.")]
NetworkOpt = Annotated[str | None, typer.Option(
    help="Container runtime: none (default), host or bridge.")]


def _given(**fields: Any) -> dict[str, Any]:
    """The options given (not None), as the job's fields."""
    return {k: v for k, v in fields.items() if v is not None}


@asynccontextmanager
async def _jobs(cfg: Any, *, sink: Callable[[list[LogLine]], Awaitable[None]] | None = None
                ) -> AsyncIterator[JobService]:
    """The control plane's jobs on the config's databases, as ``crawlhub serve`` opens
    them (builds for project jobs, the log store, alerts) but without cron; ``sink``
    also gets every log line of the runs started here."""
    from crawlhub.control.plane import ControlPlane

    plane = await ControlPlane.open(cfg)
    try:
        await plane.logs.start(collect=False, prune=False, ship=False)  # flush task only
        if sink is not None:
            store = plane.logs.write

            async def both(lines: list[LogLine]) -> None:
                await sink(lines)
                await store(lines)

            plane.jobs.runner.log_sink = both
        yield plane.jobs
    finally:
        await plane.close()


def _call(cfg: Any, fn: Callable[[JobService], Awaitable[T]]) -> T:
    async def go() -> T:
        async with _jobs(cfg) as jobs:
            return await fn(jobs)

    return run(go())


@app.command("list")
def list_command(after: Annotated[str | None, typer.Option(help="Page after this name.")] = None,
                 limit: Annotated[int, typer.Option(min=1, max=1000, help="Jobs a page.")] = 100,
                 as_json: JsonOpt = False, config: ConfigOpt = None,
                 data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """Jobs by name: cron, next tick, state, last run."""
    cfg = get_config(config, data_dir, sets)
    views = _call(cfg, lambda jobs: jobs.list_jobs(after=after, limit=limit))
    if as_json:
        print_json([v.model_dump() for v in views])
        return
    table = Table(title=f"{len(views)} jobs", collapse_padding=True)
    for col in ("name", "kind", "cron", "next tick", "state", "last run", "status"):
        table.add_column(col)
    for v in views:
        state = "paused" if v.desired == "pause" else "running" if v.running else "idle"
        last = v.last_run
        table.add_row(escape(v.spec.name), v.spec.kind, escape(v.spec.cron or "-"),
                      when(v.next_fire), state, last.id if last else "-",
                      last.status if last else "-")
    out.print(table)


@app.command("add")
def add_command(name: NameArg,
                command: Annotated[list[str], typer.Argument(help="The program and its"
                                                             " arguments (after --).")],
                kind: Annotated[str, typer.Option(help="subprocess or crawl")] = "subprocess",
                cron: Annotated[str | None, typer.Option(help="e.g. '*/10 * * * *'")] = None,
                project: Annotated[str | None, typer.Option(help="The project whose build it runs in.")] = None,
                version: Annotated[str | None, typer.Option(help="The build's version (latest: the highest version built).")] = None,
                env: Annotated[list[str] | None, typer.Option(help="NAME=VALUE")] = None,
                notes: Annotated[str, typer.Option(help="Free text shown with the job.")] = "",
                timeout: Annotated[float | None, typer.Option(help="seconds")] = None,
                max_instances: Annotated[int, typer.Option(min=1, help="Runs at once (1: no overlap).")] = 1,
                pausable: Annotated[bool, typer.Option("--pausable/--not-pausable", help="Whether pause may hold its runs (not pausable: pause is refused).")] = True,
                grace: Annotated[float | None, typer.Option(help="Seconds between SIGTERM and SIGKILL on cancel (default: control.grace; 180 for Scrapy).")] = None,
                runtime: RuntimeOpt = None, image: ImageOpt = None, cpus: CpusOpt = None,
                memory: MemoryOpt = None, pids: PidsOpt = None, network: NetworkOpt = None,
                config: ConfigOpt = None, data_dir: DataDirOpt = None,
                sets: SetOpt = None) -> None:
    """Add a job.

    ``crawlhub jobs add news -- python news.py --since 1d``; in a container:
    ``crawlhub jobs add news --runtime container --image localhost/crawlhub-base:1
    --memory 256m -- python3 news.py``"""
    cfg = get_config(config, data_dir, sets)
    pairs = dict(item.split("=", 1) for item in env or [] if "=" in item)
    box = _given(runtime=runtime, image=image, cpus=cpus, memory=memory, pids=pids,
                 network=network)
    try:
        spec = JobSpec.model_validate(
            {"name": name, "kind": kind, "command": command, "cron": cron,
             "project": project, "version": version, "env": pairs, "notes": notes,
             "timeout": timeout, "max_instances": max_instances, "pausable": pausable,
             "grace": grace, **box})
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    view = _call(cfg, lambda jobs: jobs.create(spec))
    out.print(f"added job {escape(view.spec.name)}"
              + (f"; next tick {when(view.next_fire)}" if view.next_fire else ""))


@app.command("show")
def show_command(name: NameArg, as_json: JsonOpt = False, config: ConfigOpt = None,
                 data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """A job's spec, state, queue figures and runs."""
    cfg = get_config(config, data_dir, sets)

    async def get(jobs: JobService) -> dict[str, Any]:
        view = await jobs.get(name)
        return {"job": view.model_dump(), "queue": (await jobs.queue(name)).model_dump(),
                "runs": [r.model_dump() for r in await jobs.runs(job=name, limit=10)]}

    data = _call(cfg, get)
    if as_json:
        print_json(data)
        return
    spec = data["job"]["spec"]
    out.print(f"[bold]{escape(spec['name'])}[/] ({spec['kind']}): "
              f"{escape(' '.join(spec['command'] + spec['args']))}")
    out.print(f"cron {escape(spec['cron'] or '-')}  next {when(data['job']['next_fire'])}"
              f"  desired {data['job']['desired']}  max_instances {spec['max_instances']}")
    if spec.get("runtime") or spec.get("image"):
        box = "  ".join(f"{k} {spec[k]}" for k in ("image", "cpus", "memory", "pids", "network")
                        if spec.get(k) is not None)
        out.print(f"runtime {spec.get('runtime') or 'control.runtime'}"
                  + (f"  {escape(box)}" if box else ""))
    q = data["queue"]
    out.print("queue: " + "  ".join(f"{k} {q[k] if q[k] is not None else '-'}"
                                    for k in ("left", "total", "success", "failed", "retried",
                                              "rate")))
    for r in data["runs"]:
        out.print(f"  {r['id']}  {r['status']:<10} {when(r['started_at'])}  exit"
                  f" {r['exit_code'] if r['exit_code'] is not None else '-'}")


@app.command("remove")
def remove_command(name: NameArg, config: ConfigOpt = None, data_dir: DataDirOpt = None,
                   sets: SetOpt = None) -> None:
    """Remove a job; its history stays."""
    cfg = get_config(config, data_dir, sets)
    _call(cfg, lambda jobs: jobs.delete(name))
    out.print(f"removed job {escape(name)}")


@app.command("set")
def set_command(name: NameArg,
                cron: Annotated[str | None, typer.Option(help="'' removes the cron")] = None,
                enabled: Annotated[bool | None, typer.Option("--enabled/--disabled", help="Let cron and run start it, or not.")] = None,
                max_instances: Annotated[int | None, typer.Option(min=1, help="Runs at once.")] = None,
                timeout: Annotated[float | None, typer.Option(help="Seconds a run may take.")] = None,
                notes: Annotated[str | None, typer.Option(help="Free text shown with the job.")] = None,
                pausable: Annotated[bool | None, typer.Option("--pausable/--not-pausable", help="Whether pause may hold its runs.")] = None,
                grace: Annotated[float | None, typer.Option(help="Seconds between SIGTERM and SIGKILL on cancel.")] = None,
                runtime: RuntimeOpt = None, image: ImageOpt = None, cpus: CpusOpt = None,
                memory: MemoryOpt = None, pids: PidsOpt = None, network: NetworkOpt = None,
                config: ConfigOpt = None, data_dir: DataDirOpt = None,
                sets: SetOpt = None) -> None:
    """Change some fields of a job."""
    cfg = get_config(config, data_dir, sets)
    changes = _given(cron=cron, enabled=enabled, notes=notes, max_instances=max_instances,
                     timeout=timeout, pausable=pausable, grace=grace, runtime=runtime,
                     image=image, cpus=cpus, memory=memory, pids=pids, network=network)
    try:
        patch = JobPatch.model_validate(changes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    view = _call(cfg, lambda jobs: jobs.update(name, patch))
    out.print(f"changed job {escape(name)}; next tick {when(view.next_fire)}")


def _state_command(verb: str) -> Callable[..., None]:
    def command(name: NameArg, config: ConfigOpt = None, data_dir: DataDirOpt = None,
                sets: SetOpt = None) -> None:
        cfg = get_config(config, data_dir, sets)
        if verb == "pause":
            _call(cfg, lambda jobs: jobs.pause(name))
            out.print(f"job {escape(name)}: paused (its runs hold still; new runs start"
                      " paused until 'crawlhub jobs continue')")
        elif verb == "continue":
            _call(cfg, lambda jobs: jobs.resume(name))
            out.print(f"job {escape(name)}: continues")
        else:
            asked = _call(cfg, lambda jobs: jobs.cancel(name))
            out.print(f"job {escape(name)}: asked {len(asked)} run(s) to stop"
                      + (f" ({', '.join(asked)})" if asked else ""))

    command.__doc__ = {"pause": "Pause a job: its runs hold still.",
                       "continue": "Continue a paused job.",
                       "cancel": "Cancel a job's runs.\n\nSIGTERM, then SIGKILL after the"
                                 " grace period."}[verb]
    return command


for _verb in ("pause", "continue", "cancel"):
    app.command(_verb)(_state_command(_verb))


@app.command("run")
def run_command(name: NameArg,
                server: Annotated[str | None, typer.Option(
                    help="Ask this crawlhub server to run it (e.g. http://127.0.0.1:8526)"
                    " instead of running it here.")] = None,
                config: ConfigOpt = None, data_dir: DataDirOpt = None,
                sets: SetOpt = None) -> None:
    """Run a job now.

    Here in the foreground (its log lines printed; exit code 0 when it succeeded), or on
    a server with --server."""
    cfg = get_config(config, data_dir, sets)
    if server:
        body = _post(server, f"/jobs/{name}/run", cfg)
        out.print(f"job {escape(name)}: run {body.get('run_id')} started on {escape(server)}")
        return

    async def show(lines: list[LogLine]) -> None:
        for line in lines:
            task = f"[{line.task}] " if line.task else ""
            out.print(f"{line.level:<7} {escape(task + line.message)}", highlight=False)

    async def go() -> RunRecord:
        async with _jobs(cfg, sink=show) as jobs:
            started = await jobs.run(name, trigger="cli")
            out.print(f"job {escape(name)}: run {started.id}")
            try:
                return await jobs.runner.wait(started.id)
            except asyncio.CancelledError:
                jobs.runner.stop_local(name)
                return await jobs.runner.wait(started.id)

    record = run(go())
    out.print(f"run {record.id}: {record.status}"
              + (f" (exit {record.exit_code})" if record.exit_code is not None else "")
              + (f": {escape(record.error)}" if record.error else ""))
    raise typer.Exit(0 if record.status == "succeeded" else 1)


def _post(server: str, path: str, cfg: Any) -> dict[str, Any]:
    import urllib.error
    import urllib.request

    token = cfg.server.token.get_secret_value() if cfg.server.token else None
    request = urllib.request.Request(server.rstrip("/") + path, data=b"", method="POST")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (the user's server)
            return json.loads(answer.read() or b"{}")  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")
        out.print(f"[red]{exc.code}[/]: {escape(detail)}")
        sys.exit(1)
    except OSError as exc:
        out.print(f"[red]cannot reach {escape(server)}[/]: {escape(str(exc))}")
        sys.exit(1)

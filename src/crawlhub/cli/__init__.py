"""The ``crawlhub`` command: serve, check-config, submit, route, queues, lease, ack, nack,
plus the frontier and collect sub-commands. A thin shell over the same services the API
uses."""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from crawlhub.core import jsoncodec
from crawlhub.core.errors import ConfigError, CrawlhubError, MissingExtraError, NotFoundError

# Start-up: nothing heavy at import (no config models, web stack, YAML, tables). Each
# command imports what it uses, and the sub-commands are imported when run (_LazyGroup):
# ``crawlhub --help`` imports none of them. tests/cli/test_startup.py guards this.


class _LazyGroup(TyperGroup):
    """The root group: the sub-command modules of :data:`_LAZY` are imported when a
    command of theirs runs (or its help is asked for), not to list them in ``--help``.
    A module that fails to import fails that command loudly, with its error."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*self.commands, *(name for name, _, _ in _LAZY if name not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = self.commands.get(cmd_name)
        if cmd is None and cmd_name in _LAZY_MODULES:
            cmd = self.commands[cmd_name] = _load_subcommand(cmd_name)
        return cmd

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # TyperGroup.format_commands with the summaries of unloaded sub-commands taken from
        # _LAZY instead of importing them
        rows: list[tuple[str, str]] = []
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        for name in names:
            cmd = self.commands.get(name)
            if cmd is None:
                rows.append((name, _LAZY_SUMMARIES[name]))
            elif not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(cls=_LazyGroup, add_completion=False, no_args_is_help=True,
                  rich_markup_mode=None,
                  help="crawlhub: task intake, rule routing, reliable queues, frontier and"
                  " collection jobs.")


class _Console:
    """rich's :class:`~rich.console.Console`, made on first use: a command that prints
    nothing with it (``crawlhub serve`` once started) does not import rich (~17 ms of
    ``python -X importtime``)."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._console: Any = None

    @property
    def console(self) -> Any:
        """The Console itself (for rich's classes that take one)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


def escape(text: str) -> str:
    """rich's markup escape (rich imported when first needed: :class:`_Console`)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def say(line: str) -> None:
    """A plain line on stderr, as written (no markup, no rich)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


out: Any = _Console()
err: Any = _Console(stderr=True)

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", envvar="CRAWLHUB_CONFIG",
    help="YAML config file (default: the built-in config: one http inbound, one queue).")]
DataDirOpt = Annotated[Path | None, typer.Option(
    "--data-dir", envvar="CRAWLHUB_DATA_DIR", help="Where embedded data lives"
    " (default ./crawlhub-data).")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="Setting name=value, highest layer over .env, .env.local and environment.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def print_json(value: Any) -> None:
    """``value`` as one line of JSON on stdout (what ``--json`` prints)."""
    out.print(json.dumps(value, ensure_ascii=False, default=str), markup=False,
              highlight=False, soft_wrap=True)


def when(ts: float | None) -> str:
    """A time as local ``YYYY-MM-DD HH:MM:SS``; ``-`` for none."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def parse_sets(values: list[str] | None) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"--set takes name=value, got {item!r}")
        result[name.strip()] = value
    return result


def get_config(config: Path | None, data_dir: Path | None = None,
               sets: list[str] | None = None) -> Any:
    """Load the config (or the built-in one); print the errors and exit 2 on failure."""
    from crawlhub.config import default_config, load_config

    overrides = parse_sets(sets)
    if data_dir is not None:
        overrides.setdefault("data_dir", str(data_dir))
    try:
        if config is None:
            return default_config(None, overrides=overrides)
        return load_config(config, overrides=overrides)
    except CrawlhubError as exc:
        fail(exc)


def fail(exc: CrawlhubError) -> NoReturn:
    """Print a crawlhub error the one way every command does, then exit, no traceback:
    a ConfigError as ``config error`` and its lines (exit 2); a missing extra as one line
    with its ``pip install`` (exit 2); any other as one ``error`` line (exit 1)."""
    raise typer.Exit(report(exc))


def report(exc: CrawlhubError) -> int:
    """Print ``exc`` as :func:`fail` does; its exit code."""
    if isinstance(exc, ConfigError):
        err.print(f"[bold red]config error[/]\n{escape(str(exc))}", markup=True,
                  highlight=False, soft_wrap=True)
        return 2
    err.print(f"[bold red]error[/] {escape(str(exc))}", markup=True, highlight=False,
              soft_wrap=True)
    return 2 if isinstance(exc, MissingExtraError) else 1


def run(coro: Any) -> Any:
    """Run a command's async part; a crawlhub error is printed by :func:`fail`."""
    import asyncio  # (here: a help listing runs nothing, and imports no event loop)

    try:
        return asyncio.run(coro)
    except CrawlhubError as exc:  # found while building services: a bad class, init, ...
        fail(exc)


# ---------------------------------------------------------------------------- serve
@app.command()
def serve(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    bind: Annotated[str | None, typer.Option(help="Address to bind (server.bind).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (server.port).")] = None,
    sets: SetOpt = None,
) -> None:
    """Run the hub, its HTTP API and auto-start jobs.

    Runs the inbounds and auto-start jobs of the config (or the built-in config) until
    Ctrl-C. A config it cannot run is reported like check-config reports it (exit 2),
    and so is a bind other machines reach without server.token (unless
    server.insecure_no_token: true).
    """
    from crawlhub.core import heap

    # Start-up allocates much and frees little (modules, models, routes): the cyclic
    # collector pauses (~40 ms of serve's ~0.45 s start-up) and runs again once the app
    # is built, over what serving allocates (see crawlhub.core.heap).
    with heap.starting():
        import uvicorn

        from crawlhub.app.asgi import create_app
        from crawlhub.core.logsetup import setup_logging
        from crawlhub.core.redact import configure_secrets

        cfg = get_config(config, data_dir, sets)
        _check_hub(cfg)  # a bad class ends here as check-config reports it, before uvicorn starts
        if bind:
            cfg.server.bind = bind
        if port:
            cfg.server.port = port
        _check_exposure(cfg, serving=True, bind_given=bool(bind))
        scrapyd_socket = _scrapyd_socket(cfg)  # before anything starts: refused or taken, it ends here
        configure_secrets(cfg.logging.secret_names, cfg.logging.public_names)
        setup_logging(cfg.logging.level, cfg.logging.format, cfg.logging.file)
        say(f"crawlhub {cfg.project}: http://{cfg.server.bind}:{cfg.server.port}"
            f"  data: {Path(cfg.data_dir).resolve()}  queues: {_scheme(cfg.storage.queues)}")
        app_ = create_app(cfg)
        # What is imported and built by now lives as long as the server: out of the
        # cyclic collector's sight, its full collections scan only what serving allocates
        # (one over a heap this size took ~70 ms, 10% of POST /task/'s time in
        # bench/route.py). A refused config or port ends the command, not the collector.
        heap.started()
    asgi = _StartupErrors(app_)
    server = uvicorn.Server(uvicorn.Config(asgi, host=cfg.server.bind, port=cfg.server.port,
                                           log_level=cfg.logging.level.lower(),
                                           access_log=False, ws="none"))  # no WebSockets here
    logging.getLogger("uvicorn.error").addFilter(lambda record: asgi.error is None)
    run: Any = server.run
    if scrapyd_socket is not None:  # Scrapyd's API on a port of its own (docs/scrapyd.md)
        from crawlhub.app.scrapyd import serve_with_scrapyd

        say(f"scrapyd API: http://{cfg.scrapyd.bind}:{cfg.scrapyd.port}")
        run = functools.partial(serve_with_scrapyd, server, app_, cfg, scrapyd_socket)
    try:
        run()
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down already
        pass
    except SystemExit:  # uvicorn's exit on a failed startup: say why if it was ours
        if asgi.error is not None:
            fail(asgi.error)
        raise


def _scrapyd_socket(cfg: Any) -> Any:
    """With ``scrapyd.enabled``, the socket of Scrapyd's API, bound; None without. A
    reachable ``scrapyd.bind`` without a token is refused (unless
    ``server.insecure_no_token``), a taken port named: both exit 2."""
    if not cfg.scrapyd.enabled:
        return None
    from crawlhub.app import scrapyd

    if (problem := scrapyd.exposure(cfg)) is not None and not cfg.server.insecure_no_token:
        fail(ConfigError(f"{problem}: refused; set server.token or bind scrapyd to"
                         " 127.0.0.1", entry="scrapyd", key="bind",
                         file=cfg.file_of("scrapyd", "bind")))
    try:
        return scrapyd.listen(cfg)
    except ConfigError as exc:
        fail(exc)


class _StartupErrors:
    """ASGI wrapper: a crawlhub error while the app starts (a class that does not import,
    a missing extra, a backend refused) is kept for :func:`fail`, so ``serve`` prints it
    as ``check-config`` does instead of uvicorn logging a traceback."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.error: CrawlhubError | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def lifespan_send(message: Any) -> None:
            failed = sys.exc_info()[1]  # Starlette sends "failed" inside its except block
            if message["type"] == "lifespan.startup.failed" and isinstance(failed, CrawlhubError):
                self.error = failed
                message = {**message, "message": ""}
            await send(message)

        await self.app(scope, receive, lifespan_send)


def _scheme(url: str) -> str:
    return url.split("://", 1)[0]


# ---------------------------------------------------------------------------- check-config
@app.command("check-config")
def check_config(
    file: Annotated[Path, typer.Argument(help="The main YAML config file.")],
    sets: SetOpt = None,
) -> None:
    """Print the merged config, or every error it has.

    The config is printed resolved, with secrets masked; errors name the file, the entry
    and the key (exit 2). A bind other machines reach without server.token is a warning
    (serve refuses it).
    """
    import yaml

    from crawlhub.config import dump_config

    cfg = get_config(file, None, sets)
    _check_hub(cfg)
    _check_exposure(cfg, serving=False)
    # soft_wrap: Rich must not fold long lines, or the YAML printed is not the config.
    out.print(yaml.safe_dump(dump_config(cfg), allow_unicode=True, sort_keys=False),
              highlight=False, markup=False, soft_wrap=True)


def _check_exposure(cfg: Any, *, serving: bool, bind_given: bool = False) -> None:
    """A non-loopback ``server.bind`` without a token: ``serve`` refuses it (exit 2) unless
    ``server.insecure_no_token: true`` says so in words, and then warns; ``check-config``
    warns either way (``serve --bind`` may still choose another address)."""
    problem = cfg.server.exposure()
    if problem is None:
        return
    where = {} if bind_given else {"file": cfg.file_of("server", "bind"), "entry": "server",
                                   "key": "bind"}
    fix = ("set server.token (at least 16 random characters), bind 127.0.0.1, or write"
           " 'server.insecure_no_token: true' to serve it anyway (docs/security.md)")
    if cfg.server.insecure_no_token:
        err.print(f"[bold yellow]warning[/] {escape(problem)}; server.insecure_no_token is"
                  " set, so it is served anyway", markup=True, highlight=False, soft_wrap=True)
        return
    if serving:
        fail(ConfigError(f"{problem}: refused; {fix}", **where))
    err.print(f"[bold yellow]warning[/] {escape(problem)}: 'crawlhub serve' refuses this"
              f" config; {escape(fix)}", markup=True, highlight=False, soft_wrap=True)


def _check_hub(cfg: Any) -> None:
    """Check the config's code without building anything (hub classes and converters,
    frontier functions, job sinks): user classes are imported and
    inspected (kind, methods, constructor signature), never instantiated - a config names
    trusted code, but checking it starts nothing. An error is printed by :func:`fail`."""
    from crawlhub.app.check import check_config

    try:
        check_config(cfg)
    except CrawlhubError as exc:
        fail(exc)


# ---------------------------------------------------------------------------- submit
def _read_items(path: str) -> Iterator[dict[str, Any]]:
    """Tasks from a file or stdin: a JSON object, a JSON array, or JSON lines."""
    fh = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    try:
        text = fh.read()
    finally:
        if fh is not sys.stdin:
            fh.close()
    stripped = text.lstrip()
    if stripped.startswith("["):
        data = json.loads(stripped)
        yield from data
        return
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        yield whole
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"{path}: line {number} is not JSON: {exc.msg}") from None


@app.command()
def submit(
    file: Annotated[str, typer.Argument(help="JSON, JSON array or JSON lines file; - for stdin.")] = "-",
    url: Annotated[str, typer.Option(envvar="CRAWLHUB_URL", help="Server base URL.")] = "http://127.0.0.1:8526",
    token: Annotated[str | None, typer.Option(envvar="CRAWLHUB_TOKEN", help="Bearer token.")] = None,
    batch: Annotated[int, typer.Option(min=1, max=10000, help="Tasks per request.")] = 100,
    inbound: Annotated[str | None, typer.Option(help="Push through this http inbound instead of /task/.")] = None,
) -> None:
    """Submit tasks to a running server, in batches.

    Shows a progress bar, resends tasks deferred by a token rate, prints the counts per
    status and, for every task not taken, its index in the input, status and reason
    (exit 1 then).
    """
    try:
        items = list(_read_items(file))
    except (OSError, json.JSONDecodeError) as exc:
        err.print(f"cannot read tasks from {file}: {exc}")
        raise typer.Exit(2) from None
    except RecursionError:  # deeper than the parser goes: far past MAX_DEPTH
        err.print(f"cannot read tasks from {file}: {jsoncodec.TooDeepError('a task')}")
        raise typer.Exit(2) from None
    bad = [i for i, item in enumerate(items) if not isinstance(item, dict)]
    if bad:
        err.print(f"item {bad[0]} is not a JSON object; every task must be an object")
        raise typer.Exit(2)
    from rich.table import Table

    counts, problems = run(_submit(items, url.rstrip("/"), token, batch, inbound))
    table = Table(title="submitted")
    for key in _SUBMIT_COLUMNS:
        table.add_column(key, justify="right")
    table.add_row(*(str(counts.get(k, 0)) for k in _SUBMIT_COLUMNS))
    out.print(table)
    if problems:
        _print_problems(problems, len(items))
        raise typer.Exit(1)


#: Statuses counted in their own column; any other is counted under "other".
_SUBMIT_COLUMNS = ("routed", "already_routed", "duplicate", "rejected", "other")
#: Statuses that mean the hub has the task (taken now or before).
_TAKEN = frozenset({"routed", "already_routed", "duplicate"})
_SHOWN_PROBLEMS = 50


def _print_problems(problems: list[tuple[int, str, str]], total: int) -> None:
    """Why tasks were not taken: one row per task (index in the input, status, reason)."""
    from rich.table import Table

    table = Table(title=f"{len(problems)} of {total} tasks not taken", title_justify="left")
    table.add_column("index", justify="right")
    table.add_column("status")
    table.add_column("reason", overflow="fold")
    for index, status, reason in problems[:_SHOWN_PROBLEMS]:
        table.add_row(str(index), status, escape(reason or "(the server gave no reason)"))
    err.print(table)
    if len(problems) > _SHOWN_PROBLEMS:
        err.print(f"... and {len(problems) - _SHOWN_PROBLEMS} more")


async def _submit(items: list[dict[str, Any]], url: str, token: str | None, batch: int,
                  inbound: str | None) -> tuple[dict[str, int], list[tuple[int, str, str]]]:
    """Post ``items`` in batches; counts per status and ``(index, status, reason)`` of
    every task not taken. Deferred tasks (a token rate) are sent again until taken."""
    import asyncio

    from rich.progress import Progress

    from crawlhub.fetch.http import new_session

    endpoint = f"{url}/inbound/{inbound}/" if inbound else f"{url}/task/"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    counts: dict[str, int] = {}
    problems: list[tuple[int, str, str]] = []
    async with new_session(headers=headers) as session:
        with Progress(console=err.console) as progress:
            bar = progress.add_task("submitting", total=len(items))
            for start in range(0, len(items), batch):
                pending = list(range(start, min(start + batch, len(items))))
                while pending:
                    results, retry_after = await _post(session, endpoint,
                                                       [items[i] for i in pending])
                    again = []
                    for index, result in zip(pending, results, strict=False):
                        status = str(result.get("status") or "other")
                        if status == "deferred":
                            again.append(index)
                            continue
                        key = status if status in _SUBMIT_COLUMNS else "other"
                        counts[key] = counts.get(key, 0) + 1
                        if status not in _TAKEN:
                            reason = result.get("reason") or result.get("detail") or ""
                            problems.append((index, status, str(reason)))
                    for index in pending[len(results):]:  # the answer left these out
                        counts["other"] = counts.get("other", 0) + 1
                        problems.append((index, "other", "the server's answer has no entry"
                                         " for this task"))
                    progress.advance(bar, len(pending) - len(again))
                    if again:
                        await asyncio.sleep(retry_after)
                    pending = again
    return counts, problems


async def _post(session: Any, endpoint: str,
                chunk: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """One batch posted: its per-task results and the Retry-After for deferred ones. A 503
    without per-task results (backpressure, an outage) is waited out and sent again."""
    import asyncio

    while True:
        async with session.post(endpoint, json=chunk) as resp:
            body = await resp.json(content_type=None)
            retry_after = _seconds(resp.headers.get("Retry-After"))
        results = body.get("tasks") or body.get("messages") if isinstance(body, dict) else None
        if results is None and resp.status == 503:
            await asyncio.sleep(retry_after)
            continue
        if results is None:
            detail = body.get("detail") if isinstance(body, dict) else body
            err.print(f"server answered {resp.status}: {detail}", highlight=False,
                      soft_wrap=True)
            raise typer.Exit(1)
        return [r if isinstance(r, dict) else {} for r in results], retry_after


def _seconds(value: str | None) -> float:
    try:
        return min(max(float(value or 1.0), 0.05), 60.0)
    except ValueError:
        return 1.0


# ---------------------------------------------------------------------------- route
@app.command()
def route(
    task: Annotated[str, typer.Argument(help="A task as JSON text, a file path, or - for stdin.")],
    config: ConfigOpt = None,
    inbound: Annotated[str | None, typer.Option(help="Inbound to run it through (default: the first).")] = None,
    sets: SetOpt = None,
) -> None:
    """Dry run: which outbound would take TASK.

    Prints the converted task, the selector that matched and the exact params the outbound
    would send; nothing is pushed.
    """
    cfg = get_config(config, None, sets)
    if task == "-":
        text = sys.stdin.read()
    elif os.path.isfile(task):
        text = Path(task).read_text(encoding="utf-8")
    else:
        text = task
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        err.print(f"the task is not JSON: {exc.msg} at column {exc.colno}")
        raise typer.Exit(2) from None
    except RecursionError:  # deeper than the parser goes: far past MAX_DEPTH
        err.print(str(jsoncodec.TooDeepError("the task")))
        raise typer.Exit(2) from None
    if jsoncodec.too_deep(data):
        err.print(str(jsoncodec.TooDeepError("the task")))
        raise typer.Exit(2)
    if not isinstance(data, dict):
        err.print("the task must be a JSON object")
        raise typer.Exit(2)
    report = run(_route(cfg, data, inbound))
    out.print_json(json.dumps(report, ensure_ascii=False, default=str))
    if not report.get("outbound"):
        raise typer.Exit(1)


async def _route(cfg: Any, data: dict[str, Any], inbound: str | None) -> dict[str, Any]:
    from crawlhub.services import Services

    svc = await Services.open(cfg)
    try:
        name = inbound or next(iter(svc.hub.inbounds), None)
        if name is None:
            from crawlhub.hub.routing import Candidate  # noqa: F401

            decision = svc.hub.router.route(data, explain=True)
            return {"outbound": decision.outbound.name if decision.outbound else None,
                    "reason": decision.reason}
        try:
            return await svc.hub.check_task(name, data)
        except NotFoundError as exc:  # no such inbound
            err.print(str(exc))
            raise typer.Exit(2) from None
    finally:
        await svc.close()


# ---------------------------------------------------------------------------- queues
@app.command()
def queues(config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """Stats of every queue on the configured backend."""
    from rich.table import Table

    cfg = get_config(config, data_dir, sets)
    rows = run(_queue_stats(cfg.storage.queues, cfg.storage.redis_prefix))
    # collapsed padding and a short "max" header: ten columns fit 80 characters
    table = Table(title=f"queues on {_scheme(cfg.storage.queues)}", collapse_padding=True,
                  caption="max: max_attempts, deliveries before the dead letter")
    columns = ("name", "total", "left", "ready", "leased", "success", "failed", "retried", "dead",
               "max_attempts")
    for col in columns:
        # fold, not "…": a cut queue name cannot be passed to 'crawlhub lease'
        table.add_column("max" if col == "max_attempts" else col,
                         justify="left" if col == "name" else "right",
                         overflow="fold" if col == "name" else "ellipsis")
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    out.print(table)


async def _queue_stats(url: str, prefix: str) -> list[dict[str, Any]]:
    from crawlhub.queues import open_backend

    backend = open_backend(url, prefix=prefix)
    try:
        return [(await backend.queue(n).stats()).as_dict() for n in sorted(await backend.names())]
    finally:
        await backend.close()


@app.command()
def lease(
    queue: Annotated[str, typer.Argument(help="Queue name (an outbound's init.key).")],
    n: Annotated[int, typer.Option("-n", min=1, help="How many at most.")] = 1,
    visibility: Annotated[float, typer.Option(min=0.001, help="Seconds before an unacked lease returns.")] = 60.0,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Lease messages, one JSON line per message.

    Each line: {id, receipt, attempts, priority, payload}; ack or nack them by id.
    """
    cfg = get_config(config, data_dir, sets)
    for m in run(_lease(cfg.storage, queue, n, visibility)):
        out.print(json.dumps({"id": m.id, "receipt": m.receipt, "attempts": m.attempts,
                              "priority": m.priority,
                              "payload": m.payload}, ensure_ascii=False),
                  markup=False, highlight=False, soft_wrap=True)


async def _lease(storage: Any, name: str, n: int, visibility: float) -> list[Any]:
    from crawlhub.queues import open_backend

    backend = open_backend(storage.queues, prefix=storage.redis_prefix)
    try:
        return await backend.queue(name).lease(n, visibility)
    finally:
        await backend.close()


@app.command()
def ack(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    ids: Annotated[list[str], typer.Argument(help="Message ids from 'crawlhub lease'.")],
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Finish leased messages."""
    cfg = get_config(config, data_dir, sets)
    done = run(_finish(cfg.storage, queue, ids, "ack", False))
    out.print(f"acked {done} of {len(ids)}")
    if done != len(ids):
        raise typer.Exit(1)


@app.command()
def nack(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    ids: Annotated[list[str], typer.Argument(help="Message ids from 'crawlhub lease'.")],
    dead: Annotated[bool, typer.Option(help="Send to the dead letter instead of ready.")] = False,
    reason: Annotated[str | None, typer.Option(help="Why; kept with a dead letter.")] = None,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Return leased messages to ready (or --dead).

    With --dead they go to the dead letter; a message nacked back after its queue's
    max_attempts-th delivery goes to the dead letter anyway."""
    cfg = get_config(config, data_dir, sets)
    done = run(_finish(cfg.storage, queue, ids, "nack", dead, reason))
    out.print(f"nacked {done} of {len(ids)}")
    if done != len(ids):
        raise typer.Exit(1)


async def _finish(storage: Any, name: str, ids: list[str], op: str, dead: bool,
                  reason: str | None = None) -> int:
    from crawlhub.queues import open_backend

    backend = open_backend(storage.queues, prefix=storage.redis_prefix)
    try:
        q = backend.queue(name)
        return await (q.ack(ids) if op == "ack" else q.nack(ids, dead=dead, reason=reason))
    finally:
        await backend.close()


@app.command()
def dead(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    n: Annotated[int, typer.Option("-n", min=1, help="How many at most.")] = 100,
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Peek at dead letters, oldest first.

    One JSON line each: {id, attempts, reason, priority, payload}.
    """
    cfg = get_config(config, data_dir, sets)
    for m in run(_dead(cfg.storage, queue, n)):
        out.print(json.dumps({"id": m.id, "attempts": m.attempts, "reason": m.reason,
                              "priority": m.priority, "payload": m.payload},
                             ensure_ascii=False),
                  markup=False, highlight=False, soft_wrap=True)


async def _dead(storage: Any, name: str, n: int) -> list[Any]:
    from crawlhub.queues import open_backend

    backend = open_backend(storage.queues, prefix=storage.redis_prefix)
    try:
        return await backend.queue(name).dead_letters(n)
    finally:
        await backend.close()


# ---------------------------------------------------------------------------- sub-commands
#: The sub-command modules, in ``--help`` order: (command, module, its summary in
#: ``--help``). A module holds an ``app`` (a group) or a ``<command>_command`` function.
#: The summary is the command's own first help line, repeated here so that listing the
#: commands imports none of them (tests/cli/test_help.py checks that they agree).
_LAZY: tuple[tuple[str, str, str], ...] = (
    ("collect", "crawlhub.cli.collect", "Run one collection job now and print its result."),
    ("demo", "crawlhub.cli.demo", "Serve a local demo shop and paged JSON API."),
    ("agents", "crawlhub.cli.agents",
     "Registered agents with their liveness and last heartbeat."),
    ("crawl", "crawlhub.cli.crawl", "Crawl URLs into JSON lines, resumably."),
    ("agent", "crawlhub.cli.agent", "Lease and fetch URL tasks, or serve the download center."),
    ("center", "crawlhub.cli.center",
     "Run a download center: agents for jobs, downloads routed."),
    ("frontier", "crawlhub.cli.frontier", "Frontier: dedup keys, per-segment stats, adding seeds."),
    ("jobs", "crawlhub.cli.jobs", "Jobs of every kind: subprocess, crawl, collect."),
    ("runs", "crawlhub.cli.runs", "Runs of jobs, newest first, and their tasks."),
    ("logs", "crawlhub.cli.logs", "Search, follow and prune the log store."),
    ("projects", "crawlhub.cli.projects", "Projects: git remotes whose release tags are built."),
    ("builds", "crawlhub.cli.builds", "Builds of release tags, with logs and artifacts."),
    ("alerts", "crawlhub.cli.alerts", "Alert routes per job: webhook or email."),
)
_LAZY_MODULES = {name: module for name, module, _ in _LAZY}
_LAZY_SUMMARIES = {name: summary for name, _, summary in _LAZY}


def _load_subcommand(name: str) -> Any:
    """The click command of sub-command ``name``, its module imported now. An import
    error propagates: a broken module is a bug or a broken install, never a command
    quietly gone (optional extras are imported inside the commands that need them)."""
    module = importlib.import_module(_LAZY_MODULES[name])
    # mounted on a root like ``app`` (plain help, no completion), as it always was
    holder = typer.Typer(add_completion=False, rich_markup_mode=None)
    sub = getattr(module, "app", None)
    if isinstance(sub, typer.Typer):
        holder.add_typer(sub, name=name)
    else:
        holder.command(name)(getattr(module, f"{name}_command"))
        holder.command("-")(lambda: None)  # two commands: get_group gives a group
    return typer.main.get_group(holder).commands[name]


def load_all_commands() -> Any:
    """The root click group with every sub-command loaded (what tests walk)."""
    root = typer.main.get_command(app)
    for name in root.list_commands(None):  # type: ignore[attr-defined]
        root.get_command(None, name)  # type: ignore[attr-defined]
    return root


def main() -> None:
    from crawlhub.core import heap

    heap.own()  # this process is crawlhub's: its long-running commands tune the collector
    try:
        app()
    except CrawlhubError as exc:  # one a command did not catch: still no traceback
        sys.exit(report(exc))

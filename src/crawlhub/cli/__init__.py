"""The ``crawlhub`` command: serve, check-config, submit, route, queues, lease, ack, nack,
plus the frontier and collect sub-commands. A thin shell over the same services the API
uses."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from crawlhub.config import ConfigError, default_config, dump_config, load_config
from crawlhub.errors import CrawlhubError

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="crawlhub: task intake, rule routing, reliable queues, frontier and"
                  " collection jobs.")
out = Console()
err = Console(stderr=True)

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", envvar="CRAWLHUB_CONFIG",
    help="YAML config file (default: the built-in config: one http inbound, one queue).")]
DataDirOpt = Annotated[Path | None, typer.Option(
    "--data-dir", envvar="CRAWLHUB_DATA_DIR", help="Where embedded data lives"
    " (default ./crawlhub-data).")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="Setting name=value, highest layer over .env, .env.local and environment.")]


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
    overrides = parse_sets(sets)
    if data_dir is not None:
        overrides.setdefault("data_dir", str(data_dir))
    try:
        if config is None:
            return default_config(None, overrides=overrides)
        return load_config(config, overrides=overrides)
    except ConfigError as exc:
        err.print(f"[bold red]config error[/]\n{escape(str(exc))}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def run(coro: Any) -> Any:
    """Run a command's async part; a crawlhub error is a message and exit 1, no traceback."""
    try:
        return asyncio.run(coro)
    except ConfigError as exc:  # found while building services: a bad class, init, ...
        err.print(f"[bold red]config error[/]\n{escape(str(exc))}", markup=True,
                  highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except CrawlhubError as exc:
        err.print(f"[bold red]error[/] {escape(str(exc))}", markup=True, highlight=False,
                  soft_wrap=True)
        raise typer.Exit(1) from None


# ---------------------------------------------------------------------------- serve
@app.command()
def serve(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    bind: Annotated[str | None, typer.Option(help="Address to bind (server.bind).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (server.port).")] = None,
    sets: SetOpt = None,
) -> None:
    """Run the hub, its inbounds, the HTTP API and auto-start jobs until Ctrl-C."""
    import uvicorn

    from crawlhub.api import create_app
    from crawlhub.logs import setup_logging
    from crawlhub.storage.redact import configure_secrets

    cfg = get_config(config, data_dir, sets)
    if bind:
        cfg.server.bind = bind
    if port:
        cfg.server.port = port
    configure_secrets(cfg.logging.secret_names, cfg.logging.public_names)
    setup_logging(cfg.logging.level, cfg.logging.format, cfg.logging.file)
    err.print(f"crawlhub {cfg.project}: http://{cfg.server.bind}:{cfg.server.port}"
              f"  data: {Path(cfg.data_dir).resolve()}  queues: {_scheme(cfg.storage.queues)}")
    uvicorn.run(create_app(cfg), host=cfg.server.bind, port=cfg.server.port,
                log_level=cfg.logging.level.lower(), access_log=False)


def _scheme(url: str) -> str:
    return url.split("://", 1)[0]


# ---------------------------------------------------------------------------- check-config
@app.command("check-config")
def check_config(
    file: Annotated[Path, typer.Argument(help="The main YAML config file.")],
    sets: SetOpt = None,
) -> None:
    """Print the merged, resolved config (secrets masked), or every error it has."""
    cfg = get_config(file, None, sets)
    from crawlhub.hub.hub import Hub

    # Compile the hub too: class names, converters and frontier references are checked.
    try:
        _compile_hub(cfg, Hub)
    except ConfigError as exc:
        err.print(f"[bold red]config error[/]\n{escape(str(exc))}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    # soft_wrap: Rich must not fold long lines, or the YAML printed is not the config.
    out.print(yaml.safe_dump(dump_config(cfg), allow_unicode=True, sort_keys=False),
              highlight=False, markup=False, soft_wrap=True)


def _compile_hub(cfg: Any, hub_cls: Any) -> None:
    from crawlhub.hub.state import SqliteHubState
    from crawlhub.queues.base import QueueBackend

    class _NoQueues:
        url = "check-config://"

        def queue(self, name: str) -> Any:
            return None

    queues: QueueBackend = _NoQueues()  # type: ignore[assignment]
    frontiers = {name: object() for name in (cfg.frontier or {})}
    hub_cls.from_config(cfg, queues=queues, state=SqliteHubState(":memory:"),
                        frontiers=frontiers)


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
    """Submit tasks to a running server, in batches, with a progress bar."""
    try:
        items = list(_read_items(file))
    except (OSError, json.JSONDecodeError) as exc:
        err.print(f"cannot read tasks from {file}: {exc}")
        raise typer.Exit(2) from None
    bad = [i for i, item in enumerate(items) if not isinstance(item, dict)]
    if bad:
        err.print(f"item {bad[0]} is not a JSON object; every task must be an object")
        raise typer.Exit(2)
    summary = run(_submit(items, url.rstrip("/"), token, batch, inbound))
    table = Table(title="submitted")
    for key in ("routed", "duplicate", "rejected", "deferred", "other"):
        table.add_column(key, justify="right")
    table.add_row(*(str(summary.get(k, 0)) for k in ("routed", "duplicate", "rejected",
                                                      "deferred", "other")))
    out.print(table)
    if summary.get("rejected") or summary.get("deferred"):
        raise typer.Exit(1)


async def _submit(items: list[dict[str, Any]], url: str, token: str | None, batch: int,
                  inbound: str | None) -> dict[str, int]:
    import aiohttp
    from rich.progress import Progress

    endpoint = f"{url}/inbound/{inbound}/" if inbound else f"{url}/task/"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    counts: dict[str, int] = {}
    async with aiohttp.ClientSession(headers=headers) as session:
        with Progress(console=err) as progress:
            bar = progress.add_task("submitting", total=len(items))
            for start in range(0, len(items), batch):
                chunk = items[start:start + batch]
                while True:
                    async with session.post(endpoint, json=chunk) as resp:
                        body = await resp.json(content_type=None)
                        if resp.status == 503 and "tasks" not in body and "messages" not in body:
                            await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))
                            continue
                        if resp.status >= 400 and "tasks" not in body:
                            err.print(f"server answered {resp.status}: {body.get('detail')}")
                            raise typer.Exit(1)
                        break
                results = body.get("tasks") or body.get("messages") or []
                retry = [chunk[i] for i, r in enumerate(results) if r.get("status") == "deferred"]
                for r in results:
                    status = r.get("status", "other")
                    key = status if status in ("routed", "duplicate", "rejected") else "other"
                    if status != "deferred":
                        counts[key] = counts.get(key, 0) + 1
                progress.advance(bar, len(chunk) - len(retry))
                while retry:
                    await asyncio.sleep(1.0)
                    async with session.post(endpoint, json=retry) as resp:
                        body = await resp.json(content_type=None)
                    results = body.get("tasks") or body.get("messages") or []
                    again = [retry[i] for i, r in enumerate(results)
                             if r.get("status") == "deferred"]
                    for r in results:
                        if r.get("status") != "deferred":
                            counts[r.get("status", "other")] = counts.get(r.get("status", "other"), 0) + 1
                    progress.advance(bar, len(retry) - len(again))
                    retry = again
    return counts


# ---------------------------------------------------------------------------- route
@app.command()
def route(
    task: Annotated[str, typer.Argument(help="A task as JSON text, a file path, or - for stdin.")],
    config: ConfigOpt = None,
    inbound: Annotated[str | None, typer.Option(help="Inbound to run it through (default: the first).")] = None,
    sets: SetOpt = None,
) -> None:
    """Dry run: which outbound would take TASK and the exact params it would send."""
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
    if not isinstance(data, dict):
        err.print("the task must be a JSON object")
        raise typer.Exit(2)
    report = run(_route(cfg, data, inbound))
    out.print_json(json.dumps(report, ensure_ascii=False, default=str))
    if not report.get("outbound"):
        raise typer.Exit(1)


async def _route(cfg: Any, data: dict[str, Any], inbound: str | None) -> dict[str, Any]:
    from crawlhub.service import Services

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
        except KeyError as exc:
            err.print(str(exc.args[0]))
            raise typer.Exit(2) from None
    finally:
        await svc.close()


# ---------------------------------------------------------------------------- queues
@app.command()
def queues(config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """Stats of every queue on the configured backend."""
    cfg = get_config(config, data_dir, sets)
    rows = run(_queue_stats(cfg.storage.queues, cfg.storage.redis_prefix))
    table = Table(title=f"queues on {_scheme(cfg.storage.queues)}")
    columns = ("name", "total", "left", "ready", "leased", "success", "failed", "retried", "dead")
    for col in columns:
        # fold, not "…": a cut queue name cannot be passed to 'crawlhub lease'
        table.add_column(col, justify="left" if col == "name" else "right",
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
    """Lease messages; prints one JSON line per message: {id, attempts, payload}."""
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
    config: ConfigOpt = None, data_dir: DataDirOpt = None, sets: SetOpt = None,
) -> None:
    """Return leased messages to ready, or to the dead letter with --dead."""
    cfg = get_config(config, data_dir, sets)
    done = run(_finish(cfg.storage, queue, ids, "nack", dead))
    out.print(f"nacked {done} of {len(ids)}")
    if done != len(ids):
        raise typer.Exit(1)


async def _finish(storage: Any, name: str, ids: list[str], op: str, dead: bool) -> int:
    from crawlhub.queues import open_backend

    backend = open_backend(storage.queues, prefix=storage.redis_prefix)
    try:
        q = backend.queue(name)
        return await (q.ack(ids) if op == "ack" else q.nack(ids, dead=dead))
    finally:
        await backend.close()


# ---------------------------------------------------------------------------- sub-commands
def _mount_optional() -> None:
    for module_name, command in (("crawlhub.cli.frontier", "frontier"),
                                 ("crawlhub.cli.collect", "collect"),
                                 ("crawlhub.cli.demo", "demo")):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        sub = getattr(module, "app", None)
        if isinstance(sub, typer.Typer):
            app.add_typer(sub, name=command)
        elif callable(getattr(module, f"{command}_command", None)):
            app.command(command)(getattr(module, f"{command}_command"))


_mount_optional()


def main() -> None:
    app()

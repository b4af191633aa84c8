"""``crawlhub builds``: the builds of the projects on the control database of the config
(``control.url``), newest first, and one build with its log; :func:`call` opens that
database for the ``projects`` commands too."""

from __future__ import annotations

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
    get_config,
    out,
    print_json,
    run,
    when,
)
from crawlhub.control.builds import STATUSES, Build, BuildService

app = typer.Typer(help="Builds of release tags, with logs and artifacts.",
                  no_args_is_help=True)
T = TypeVar("T")


@asynccontextmanager
async def open_builds(cfg: Any) -> AsyncIterator[BuildService]:
    """The projects and builds on the config's control database (``.projects`` on the
    service); builds left unfinished by a dead process are marked failed on opening."""
    from crawlhub.control.db import ControlDB
    from crawlhub.control.secrets import SecretBox

    box = SecretBox.from_config(cfg)
    db = await ControlDB.open(cfg.control.url)
    try:
        builds = await BuildService.open_section(db, box, cfg.control)
        try:
            yield builds
        finally:
            await builds.close()
    finally:
        await db.close()


def call(cfg: Any, fn: Callable[[BuildService], Awaitable[T]]) -> T:
    async def go() -> T:
        async with open_builds(cfg) as builds:
            return await fn(builds)

    return run(go())  # type: ignore[no-any-return]


def build_table(builds: list[Build], title: str) -> Table:
    table = Table(title=title, collapse_padding=True)
    for name in ("id", "project", "version", "ref", "status", "trigger", "finished",
                 "artifact / error"):
        table.add_column(name, overflow="fold")
    for b in builds:
        status = {"succeeded": "[green]succeeded[/]", "failed": "[red]failed[/]"}.get(
            b.status, b.status)
        table.add_row(str(b.id), escape(b.project), escape(b.version), escape(b.ref), status,
                      b.trigger, when(b.finished),
                      escape(b.error or f"{b.artifact_kind or ''} {b.artifact_path or ''}"))
    return table


@app.command("list")
def list_command(
    project: Annotated[str | None, typer.Option(help="Only this project's builds.")] = None,
    status: Annotated[str | None, typer.Option(help=", ".join(STATUSES))] = None,
    before: Annotated[int | None, typer.Option(help="Page: builds older than this id.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Builds at most.")] = 50,
    as_json: JsonOpt = False, config: ConfigOpt = None, data_dir: DataDirOpt = None,
    sets: SetOpt = None,
) -> None:
    """Builds, newest first."""
    if status is not None and status not in STATUSES:
        raise typer.BadParameter(f"--status is one of {', '.join(STATUSES)}")
    cfg = get_config(config, data_dir, sets)

    async def go(b: BuildService) -> list[Build]:
        return await b.list(project=project, status=status, limit=limit, before=before)

    builds: list[Build] = call(cfg, go)
    if as_json:
        print_json([b.model_dump() for b in builds])
        return
    out.print(build_table(builds, f"{len(builds)} builds"))


@app.command("show")
def show_command(
    build_id: Annotated[int, typer.Argument(help="The build's id.")],
    log: Annotated[bool, typer.Option("--log/--no-log", help="Print its log too.")] = True,
    as_json: JsonOpt = False, config: ConfigOpt = None, data_dir: DataDirOpt = None,
    sets: SetOpt = None,
) -> None:
    """A build: what, how it went, its artifact, and its log."""
    cfg = get_config(config, data_dir, sets)
    build: Build = call(cfg, lambda b: b.get(build_id))
    if as_json:
        print_json(build.model_dump() if log else build.model_dump(exclude={"log"}))
        return
    table = Table(show_header=False, title=f"build {build.id}", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for field, value in (
            ("project", build.project), ("version", build.version), ("ref", build.ref),
            ("commit", build.commit or "-"), ("status", build.status),
            ("builder", build.builder), ("trigger", build.trigger),
            ("artifact", f"{build.artifact_kind} {build.artifact_path}"
             if build.artifact_kind else "-"), ("error", build.error or "-"),
            ("created", when(build.created)), ("started", when(build.started)),
            ("finished", when(build.finished))):
        table.add_row(field, escape(str(value)))
    out.print(table)
    if log and build.log:
        out.print(build.log, markup=False, highlight=False, soft_wrap=True)


@app.command("base-image")
def base_image_command(
    tag: Annotated[str | None, typer.Option(help="The image's tag (default: the image"
                                            " builder's default base).")] = None,
    engine: Annotated[str, typer.Option(help="The engine's program (podman or"
                                        " docker).")] = "podman",
) -> None:
    """Build the image builder's default base from this host's Python.

    FROM scratch with Debian's python3.11, its standard library and the libraries it
    links: no registry is needed. Nothing is done when the engine has the tag already."""
    import time

    from crawlhub.control.builders.baseimage import BASE_IMAGE, NoEngine, ensure_base_image

    start = time.monotonic()
    try:
        done = ensure_base_image(tag or BASE_IMAGE, engine)
    except NoEngine as exc:
        err.print(f"[red]base image:[/] {escape(str(exc))}")
        raise typer.Exit(1) from None
    out.print(f"base image {done} ready ({time.monotonic() - start:.1f} s)")

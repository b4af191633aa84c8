"""``crawlhub projects``: list, add, show, update, remove and build projects on the control
database of the config (``control.url``).

Passwords and webhook secrets never go on the command line unless asked for: they come
from stdin (``--password-stdin``), a prompt (``--ask-password``) or a file; a plain
``--password`` flag exists for scripts, but the shell's history and ``ps`` show it.
``crawlhub projects build NAME --tag ...`` builds here, in the foreground, printing the
build's log, and exits 0 when it succeeded.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
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
    when,
)
from crawlhub.cli.builds import build_table, call
from crawlhub.control.builds import Build, BuildService
from crawlhub.control.projects import (
    InvalidProject,
    NewProject,
    Project,
    ProjectUpdate,
)

app = typer.Typer(help="Projects: git remotes whose release tags are built.",
                  no_args_is_help=True)
T = TypeVar("T")

_HISTORY = " Visible in the shell's history and in ps: prefer --password-stdin or --ask-password."


def model(cls: type[T], data: dict[str, Any]) -> T:
    """``cls`` validated from ``data``; its problems printed (never the values: one may
    be a password) and exit 2 otherwise."""
    try:
        return cls.model_validate(data)  # type: ignore[attr-defined,no-any-return]
    except ValidationError as exc:
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"]) or "project"
            err.print(f"{escape(where)}: {escape(e['msg'])}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _read_secret(stdin: bool, ask: bool, flag: str | None, file: Path | None,
                 what: str) -> str | None:
    given = [x for x in (stdin, ask, flag is not None, file is not None) if x]
    if len(given) > 1:
        raise typer.BadParameter(f"give the {what} one way only")
    if stdin:
        return sys.stdin.readline().rstrip("\r\n")
    if ask:
        return str(typer.prompt(what.capitalize(), hide_input=True))
    if file is not None:
        try:
            return file.read_text().strip()
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {file}: {exc.strerror}") from None
    return flag


def _webhook_secret(flag: str | None, file: Path | None, generate: bool) -> str | None:
    """The webhook secret given (flag or file) or, with ``generate``, a new random one."""
    given = _read_secret(False, False, flag, file, "webhook secret")
    if not generate:
        return given
    if given is not None:
        raise typer.BadParameter("--generate-webhook-secret or a webhook secret, not both")
    return secrets.token_urlsafe(32)


def _answer(project: Project, as_json: bool, generated: str | None) -> None:
    """The project as stored, and a generated webhook secret (its one showing)."""
    if as_json:
        print_json(project.model_dump())
    else:
        _show(project)
    if generated is not None:
        err.print("webhook secret (shown once; set it on the forge's hook):", highlight=False)
        out.print(generated, markup=False, highlight=False)


def _builder(name: str | None, options: str | None) -> dict[str, Any] | None:
    if name is None and options is None:
        return None
    try:
        opts = json.loads(options) if options else {}
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"--builder-options is not JSON: {exc.msg}") from None
    return {"name": name or "venv", "options": opts}


PasswordStdin = Annotated[bool, typer.Option("--password-stdin",
                                             help="Read the password or token from stdin"
                                             " (its first line).")]
AskPassword = Annotated[bool, typer.Option("--ask-password", help="Prompt for the password.")]
PasswordFlag = Annotated[str | None, typer.Option("--password", help="The password or token."
                                                  + _HISTORY)]
SecretFile = Annotated[Path | None, typer.Option("--webhook-secret-file",
                                                 help="Read the webhook secret from a file.")]
SecretFlag = Annotated[str | None, typer.Option(
    "--webhook-secret", help="The webhook secret. Visible in the shell's history and in ps:"
    " prefer --webhook-secret-file or --generate-webhook-secret.")]
GenerateSecret = Annotated[bool, typer.Option(
    "--generate-webhook-secret", help="Make a random webhook secret, store it and print it"
    " once (set the same on the forge's hook).")]
NameArg = Annotated[str, typer.Argument(help="The project's name.")]
BuilderOpt = Annotated[str | None, typer.Option(help="venv, wheel, docker or command.")]
BuilderOptionsOpt = Annotated[str | None, typer.Option(
    "--builder-options", help='The builder\'s options as JSON, e.g. \'{"argv": ["make"]}\'.')]


@app.command("list")
def list_command(after: Annotated[str | None, typer.Option(help="Page after this name.")] = None,
                 limit: Annotated[int, typer.Option(min=1, max=1000,
                                                    help="Projects at most.")] = 100,
                 as_json: JsonOpt = False, config: ConfigOpt = None,
                 data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """Projects by name."""
    cfg = get_config(config, data_dir, sets)
    rows: list[Project] = call(cfg, lambda b: b.projects.list(limit=limit, after=after))
    if as_json:
        print_json([p.model_dump() for p in rows])
        return
    table = Table(title=f"{len(rows)} projects", collapse_padding=True)
    for name in ("project", "git url", "user", "password", "hook secret", "branch",
                 "tag pattern", "builder"):
        table.add_column(name, overflow="fold")
    for p in rows:
        table.add_row(escape(p.name), escape(p.git_url), escape(p.username or "-"),
                      "set" if p.has_password else "-",
                      "set" if p.has_webhook_secret else "[red]none[/]",
                      escape(p.default_branch), escape(p.tag_pattern), escape(p.builder.name))
    out.print(table)


@app.command("add")
def add_command(
    name: NameArg,
    git_url: Annotated[str, typer.Argument(help="https://, ssh://, user@host:path, file://"
                                                " or an absolute path.")],
    username: Annotated[str | None, typer.Option(help="User name for the remote.")] = None,
    password_stdin: PasswordStdin = False, ask_password: AskPassword = False,
    password: PasswordFlag = None,
    webhook_secret_file: SecretFile = None, webhook_secret: SecretFlag = None,
    generate_webhook_secret: GenerateSecret = False,
    default_branch: Annotated[str, typer.Option(help="The default branch.")] = "main",
    tag_pattern: Annotated[str | None, typer.Option(
        help="Release tags that build (default control.tag_pattern).")] = None,
    release_name: Annotated[str | None, typer.Option(
        help="The {name} its release tags carry (default: the project's name).")] = None,
    builder: BuilderOpt = None, builder_options: BuilderOptionsOpt = None,
    as_json: JsonOpt = False, config: ConfigOpt = None, data_dir: DataDirOpt = None,
    sets: SetOpt = None,
) -> None:
    """Add a project.

    The password and the webhook secret are stored encrypted and never shown again.
    """
    cfg = get_config(config, data_dir, sets)
    secret = _webhook_secret(webhook_secret, webhook_secret_file, generate_webhook_secret)
    data: dict[str, Any] = {
        "name": name, "git_url": git_url, "username": username,
        "password": _read_secret(password_stdin, ask_password, password, None, "password"),
        "webhook_secret": secret, "default_branch": default_branch,
        "tag_pattern": tag_pattern, "release_name": release_name,
        "builder": _builder(builder, builder_options)}
    spec = model(NewProject, {k: v for k, v in data.items() if v is not None})
    project: Project = call(cfg, lambda b: b.projects.create(spec))
    _answer(project, as_json, secret if generate_webhook_secret else None)


@app.command("update")
def update_command(
    name: NameArg,
    git_url: Annotated[str | None, typer.Option(help="A new git URL.")] = None,
    username: Annotated[str | None, typer.Option(help="A new user name.")] = None,
    password_stdin: PasswordStdin = False, ask_password: AskPassword = False,
    password: PasswordFlag = None,
    no_password: Annotated[bool, typer.Option("--no-password",
                                              help="Remove the stored password.")] = False,
    webhook_secret_file: SecretFile = None, webhook_secret: SecretFlag = None,
    generate_webhook_secret: GenerateSecret = False,
    default_branch: Annotated[str | None, typer.Option(help="A new default branch.")] = None,
    tag_pattern: Annotated[str | None, typer.Option(help="A new tag pattern.")] = None,
    release_name: Annotated[str | None, typer.Option(help="A new release name.")] = None,
    builder: BuilderOpt = None, builder_options: BuilderOptionsOpt = None,
    as_json: JsonOpt = False, config: ConfigOpt = None, data_dir: DataDirOpt = None,
    sets: SetOpt = None,
) -> None:
    """Change the options given; the rest stays."""
    cfg = get_config(config, data_dir, sets)
    data: dict[str, Any] = {k: v for k, v in {
        "git_url": git_url, "username": username, "default_branch": default_branch,
        "tag_pattern": tag_pattern, "release_name": release_name,
        "builder": _builder(builder, builder_options)}.items() if v is not None}
    pw = _read_secret(password_stdin, ask_password, password, None, "password")
    if no_password:
        if pw is not None:
            raise typer.BadParameter("--no-password or a password, not both")
        data["password"] = None
    elif pw is not None:
        data["password"] = pw
    secret = _webhook_secret(webhook_secret, webhook_secret_file, generate_webhook_secret)
    if secret is not None:
        data["webhook_secret"] = secret
    patch = model(ProjectUpdate, data)
    project: Project = call(cfg, lambda b: b.projects.update(name, patch))
    _answer(project, as_json, secret if generate_webhook_secret else None)


@app.command("show")
def show_command(name: NameArg, as_json: JsonOpt = False, config: ConfigOpt = None,
                 data_dir: DataDirOpt = None, sets: SetOpt = None) -> None:
    """A project and its last builds."""
    cfg = get_config(config, data_dir, sets)

    async def get(b: BuildService) -> tuple[Project, list[Build]]:
        return await b.projects.get(name), await b.list(project=name, limit=10)

    project, builds = call(cfg, get)
    if as_json:
        print_json({**project.model_dump(), "builds": [b.model_dump() for b in builds]})
        return
    _show(project)
    if builds:
        out.print(build_table(builds, f"last {len(builds)} builds"))


def _show(p: Project) -> None:
    table = Table(show_header=False, title=f"project {escape(p.name)}", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for field, value in (
            ("git url", p.git_url), ("user", p.username or "-"),
            ("password", "set (encrypted)" if p.has_password else "-"),
            ("webhook secret", "set (encrypted)" if p.has_webhook_secret
             else "none: every hook is refused"),
            ("webhook path", p.hook_path), ("default branch", p.default_branch),
            ("tag pattern", p.tag_pattern), ("release name", p.release_name),
            ("builder", f"{p.builder.name} {json.dumps(p.builder.options)}"),
            ("created", when(p.created)), ("updated", when(p.updated))):
        table.add_row(field, escape(str(value)))
    out.print(table)


@app.command("remove")
def remove_command(name: NameArg, config: ConfigOpt = None, data_dir: DataDirOpt = None,
                   sets: SetOpt = None) -> None:
    """Remove a project, its builds and their directories."""
    cfg = get_config(config, data_dir, sets)
    call(cfg, lambda b: b.delete_project(name))
    out.print(f"removed project {escape(name)}")


@app.command("build")
def build_command(
    name: NameArg,
    tag: Annotated[str | None, typer.Option(help="A release tag to build.")] = None,
    ref: Annotated[str | None, typer.Option(help="A branch to build (needs --version).")] = None,
    version: Annotated[str | None, typer.Option(help="The version (a release tag gives"
                                                     " its own).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No log lines.")] = False,
    as_json: JsonOpt = False, config: ConfigOpt = None, data_dir: DataDirOpt = None,
    sets: SetOpt = None,
) -> None:
    """Build a tag or a branch here, printing its log.

    The build runs in the foreground; the exit code is 1 when it failed.
    """
    cfg = get_config(config, data_dir, sets)

    def show(line: str) -> None:
        if not quiet:
            err.print(line, markup=False, highlight=False, soft_wrap=True)

    async def go(b: BuildService) -> Build:
        try:
            build = await b.start(name, tag=tag, ref=ref, version=version, trigger="cli",
                                  watch=show)
        except InvalidProject as exc:
            err.print(f"error {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        return await b.wait(build.id)

    build: Build = call(cfg, go)
    if as_json:
        print_json(build.model_dump(exclude={"log"}))
    else:
        out.print(f"build {build.id} of {escape(build.project)} {escape(build.version)}:"
                  f" {build.status}"
                  + (f" ({escape(build.error)})" if build.error else
                     f" -> {build.artifact_kind} {escape(build.artifact_path or '')}"),
                  highlight=False, soft_wrap=True)
    if build.status != "succeeded":
        raise typer.Exit(1)


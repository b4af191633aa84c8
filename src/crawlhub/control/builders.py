"""Builders: turn a fresh clone of a project's release tag into the artifact a job runs
(a virtualenv, a wheel, a Docker image, a directory). One class per way, chosen by name.

:class:`crawlhub.control.builds.BuildService` clones the tag (:func:`clone`: credentials
through ``GIT_ASKPASS``, never in a URL, an argv or a log line), then hands a
:class:`BuildContext` to the project's builder, whose one method is
``async build(ctx) -> Artifact``. Every process a build runs goes through
:meth:`BuildContext.run`: an argv list (never a shell), the build's deadline, stdout and
stderr captured line by line into the build log with the project's secrets masked.

Builders (``BUILDERS``; :func:`register` adds one):

- ``venv`` (default): ``python -m venv --without-pip``; then ``pip install .`` when the tree
  has ``pyproject.toml``/``setup.py``, else ``pip install -r requirements.txt`` when it has
  one, else nothing (plain scripts run with the venv's python). pip is this process's own,
  pointed at the venv (``pip --python``), so no copy of pip is installed per build.
- ``wheel``: ``pip wheel --no-deps -w dist .``; a job imports it from ``PYTHONPATH``.
- ``docker``: ``docker build -t crawlhub/<project>:<version> .`` when ``docker info``
  answers; otherwise the build fails saying no Docker engine answers.
- ``command``: an argv of the project's own, run in the clone; its output directory is the
  artifact.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import importlib.metadata
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from crawlhub.core.errors import CrawlhubError
from crawlhub.core.redact import MASK, redact_text, secret_names

#: Artifact kinds a job runner knows.
KINDS = ("dir", "venv", "wheel", "image")
#: The longest line kept in a build log (characters); longer ones are cut.
MAX_LINE = 4000
#: Bytes read from a process before a line without a newline is cut into pieces.
_MAX_PENDING = 1 << 20
#: Seconds a process's output is still read after it exited (what it started may hold
#: the pipes open): a build step's, and a job run's (crawlhub.control.jobs.runner).
READ_TAIL = 2.0
#: Variables that mark every process of a build (git included): the build's id and the
#: server process that started it (``host:pid``). A server killed mid-build leaves its
#: steps running; the next one finds them by these (:func:`stop_leftovers`).
ENV_BUILD = "CRAWLHUB_BUILD"
ENV_BUILD_OWNER = "CRAWLHUB_BUILD_OWNER"


class BuildFailed(CrawlhubError):
    """A build step failed; the message is the build's one-line reason."""


# ------------------------------------------------------------------------------ artifacts
@dataclass(frozen=True)
class Artifact:
    """What a successful build leaves for jobs (``BuildService.artifact``).

    - ``kind``: ``venv`` (``path`` is the virtualenv), ``wheel`` (``path`` is the .whl
      file), ``image`` (``path`` is the Docker image tag), ``dir`` (``path`` a directory);
    - ``workdir``: the clone of the tag, where a job's command runs (None for an image);
    - ``bin_dir``: put first on ``PATH`` (``venv/bin``), or None;
    - ``env``: variables a job's process gets on top of its own (``VIRTUAL_ENV``,
      ``PYTHONPATH`` for a wheel, ``CRAWLHUB_PROJECT``/``CRAWLHUB_VERSION``); use
      :meth:`environ` to merge them with ``PATH``.
    """

    project: str
    version: str
    kind: str
    path: str
    workdir: str | None = None
    bin_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    build: int = 0
    commit: str = ""

    @property
    def python(self) -> str | None:
        """The interpreter of a ``venv`` artifact."""
        return str(Path(self.bin_dir) / "python") if self.bin_dir else None

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: ``os.environ``) with :attr:`env` on top and :attr:`bin_dir`
        first on ``PATH``; ``PYTHONPATH`` entries are prepended, not replaced."""
        out = dict(os.environ if base is None else base)
        for name, value in self.env.items():
            if name == "PYTHONPATH" and out.get(name):
                out[name] = value + os.pathsep + out[name]
            else:
                out[name] = value
        if self.bin_dir:
            out["PATH"] = self.bin_dir + (os.pathsep + out["PATH"] if out.get("PATH") else "")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "workdir": self.workdir,
                "bin_dir": self.bin_dir, "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, project: str, version: str, build: int,
                  commit: str) -> Artifact:
        return cls(project=project, version=version, kind=str(data["kind"]),
                   path=str(data["path"]), workdir=data.get("workdir"),
                   bin_dir=data.get("bin_dir"), env=dict(data.get("env") or {}),
                   build=build, commit=commit)


# ------------------------------------------------------------------------------ the log
class Redactor:
    """Masks a build's secrets in text: each one as given, URL-encoded, and as the
    base64 of ``user:password`` (an HTTP basic header), plus URL passwords and secret
    query parameters of any URL (:func:`crawlhub.core.redact.redact_text`)."""

    def __init__(self, secrets: Iterable[str] = (), *, username: str | None = None) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if not secret:
                continue
            forms.update({secret, quote(secret, safe=""), quote(secret)})
            if username is not None:
                forms.add(base64.b64encode(f"{username}:{secret}".encode()).decode())
        # longest first: a secret inside another is masked with it
        self._forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, MASK)
        return redact_text(text)


class BuildLog:
    """A build's output: the last ``max_lines`` lines (and at most ``max_chars``
    characters), secrets masked as they arrive.

    ``watch`` (optional) sees every line kept, after masking (the CLI prints them)."""

    def __init__(self, max_lines: int = 5000, redactor: Redactor | None = None,
                 watch: Callable[[str], None] | None = None, *,
                 max_chars: int = 2_000_000) -> None:
        self.lines: deque[str] = deque()
        self.max_lines = max_lines
        self.max_chars = max_chars
        self.chars = 0
        self.dropped = 0
        self.changed = False
        self.redact = redactor or Redactor()
        self.watch = watch

    def write(self, line: str) -> None:
        line = self.redact(line.rstrip("\r\n"))
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE] + f" ... [{len(line) - MAX_LINE} characters cut]"
        self.lines.append(line)
        self.chars += len(line) + 1
        while len(self.lines) > self.max_lines or (self.chars > self.max_chars
                                                    and len(self.lines) > 1):
            self.chars -= len(self.lines.popleft()) + 1
            self.dropped += 1
        self.changed = True
        if self.watch is not None:
            with contextlib.suppress(Exception):
                self.watch(line)

    def text(self) -> str:
        head = [f"[{self.dropped} earlier lines dropped]"] if self.dropped else []
        return "\n".join([*head, *self.lines])


# ------------------------------------------------------------------------------ processes
async def run_process(argv: list[str], *, cwd: Path | None, env: Mapping[str, str],
                      timeout: float, write: Callable[[str], None]) -> int:
    """Run ``argv`` (no shell) with stdin closed; every line of its stdout and stderr goes
    to ``write``; its exit code. Over ``timeout`` seconds, or cancelled, its whole process
    group is killed (the time-out is a :class:`BuildFailed`). A step is over when its
    process exits: what it left running in its group (holding the output open) is given
    :data:`READ_TAIL` seconds to finish writing, then killed - a build leaves no daemon."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True)
    except OSError as exc:
        raise BuildFailed(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    assert proc.stdout is not None
    pump = asyncio.create_task(_pump(proc.stdout, write))
    try:
        async with asyncio.timeout(max(0.01, timeout)):
            code = await exited(proc)
            done, _ = await asyncio.wait({pump}, timeout=READ_TAIL)
            if not done:  # something it started still holds the output open
                _kill_group(proc.pid)
                await pump
            return code
    except TimeoutError:
        raise BuildFailed(f"{Path(argv[0]).name} ran over the build's time limit"
                          f" ({timeout:.0f} s left; control.build_timeout)") from None
    finally:
        if proc.returncode is None:
            _kill_group(proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.shield(exited(proc))
        if not pump.done():
            _kill_group(proc.pid)
            pump.cancel()
            with contextlib.suppress(BaseException):
                await pump
        close_pipes(proc)


async def exited(proc: asyncio.subprocess.Process) -> int:
    """``proc``'s exit code once it exited. Not ``proc.wait()``: on Python 3.11 that also
    waits for its pipes to close, which a process it started may keep open long after."""
    while proc.returncode is None:
        await asyncio.sleep(0.02)
    return proc.returncode


def close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close ``proc``'s pipes, even those a process it started still holds open."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


async def _pump(stream: asyncio.StreamReader, write: Callable[[str], None]) -> None:
    pending = b""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            write(line.decode("utf-8", "replace"))
        if len(pending) > _MAX_PENDING:
            write(pending.decode("utf-8", "replace"))
            pending = b""
    if pending:
        write(pending.decode("utf-8", "replace"))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def build_marks(build: int, owner: str) -> dict[str, str]:
    """The variables marking build ``build``'s processes, run by ``owner`` (``host:pid``)."""
    return {ENV_BUILD: str(build), ENV_BUILD_OWNER: owner}


def proc_table() -> Iterator[tuple[int, list[bytes], bytes, int]]:
    """This user's processes, from Linux's ``/proc``: (pid, its environment's
    ``NAME=value`` entries, its state letter, its process group). Elsewhere, none. The
    way a build's leftovers (:func:`leftover_processes`) and a killed server's job
    processes (``crawlhub.control.jobs.runner``) are found: by their environment."""
    try:
        entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return
    for pid in entries:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:  # gone, or another user's
            continue
        try:  # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
            state, _ppid, group = stat.rsplit(b")", 1)[1].split()[:3]
            pgrp = int(group)
        except ValueError:
            continue
        yield pid, environ, state, pgrp


def leftover_processes(build: int, owner: str) -> dict[int, int]:
    """The live processes of this user that a step of build ``build`` of ``owner`` left
    running: pid -> its process group. Known by their environment (:func:`build_marks`,
    inherited by what a step starts: pip, its build backend, setup.py). Never this
    process or its group. Reads Linux's ``/proc``; elsewhere, none."""
    marks = {f"{k}={v}".encode() for k, v in build_marks(build, owner).items()}
    own_pid, own_group = os.getpid(), os.getpgrp()
    return {pid: group for pid, environ, state, group in proc_table()
            if pid != own_pid and state != b"Z" and group != own_group
            and marks <= set(environ)}


async def stop_leftovers(build: int, owner: str, *, timeout: float = 10.0) -> list[int]:
    """SIGKILL what build ``build`` of ``owner`` (a server that is gone) left running -
    each process's whole group - and wait until it is gone; the pids stopped. A build
    step has no state worth a graceful stop: the build has failed already."""
    leftovers = await asyncio.to_thread(leftover_processes, build, owner)
    for pid, group in leftovers.items():
        _kill_group(group)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while leftovers and time.monotonic() < deadline:
        alive = await asyncio.to_thread(leftover_processes, build, owner)
        if not alive.keys() & leftovers.keys():
            break
        await asyncio.sleep(0.05)
    return sorted(leftovers)


def scrubbed_environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a build's processes get: this process's, without crawlhub's own
    settings (``CRAWLHUB_*``: the secret key, tokens) and without variables whose names
    say they hold a secret (``*TOKEN*``, ``*PASSWORD*``, ``*SECRET*``, ``*KEY*``...):
    a project's setup.py is not given the server's credentials."""
    names = secret_names()
    return {k: v for k, v in (os.environ if base is None else base).items()
            if not k.upper().startswith("CRAWLHUB_") and not names(k)}


# ------------------------------------------------------------------------------ context
@dataclass
class BuildContext:
    """One build's directories, options, deadline and log, as a builder sees them.

    ``root`` is ``<builds_dir>/<project>/<version>-<build id>``, fresh for this build;
    ``src`` is the clone of the tag inside it (``root/src``)."""

    project: str
    version: str
    build: int
    ref: str
    root: Path
    options: dict[str, Any]
    log: BuildLog
    deadline: float  # time.monotonic() value
    env: dict[str, str] = field(default_factory=dict)
    commit: str = ""

    @property
    def src(self) -> Path:
        return self.root / "src"

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise BuildFailed("the build ran over its time limit (control.build_timeout)")
        return left

    def say(self, message: str) -> None:
        """A line of crawlhub's own in the build log (``--- ...``)."""
        self.log.write(f"--- {message}")

    async def run(self, argv: list[str], *, cwd: Path | None = None,
                  env: Mapping[str, str] | None = None, check: bool = True,
                  what: str | None = None) -> int:
        """Run ``argv`` in ``cwd`` (default: the clone) with the build's environment
        (``env`` added); output into the log. A non-zero exit is a :class:`BuildFailed`
        naming ``what`` (default: the program) unless ``check`` is false."""
        self.say("$ " + " ".join(_shown(a) for a in argv))
        full = {**self.env, **(env or {})}
        code = await run_process(argv, cwd=cwd or self.src, env=full,
                                 timeout=self.remaining(), write=self.log.write)
        if check and code != 0:
            raise BuildFailed(f"{what or Path(argv[0]).name} failed (exit {code}); see the"
                              " build log")
        return code

    def artifact(self, kind: str, path: Path | str, *, workdir: Path | None = None,
                 bin_dir: Path | None = None, env: Mapping[str, str] | None = None
                 ) -> Artifact:
        base = {"CRAWLHUB_PROJECT": self.project, "CRAWLHUB_VERSION": self.version}
        return Artifact(project=self.project, version=self.version, kind=kind,
                        path=str(path), workdir=str(workdir) if workdir else None,
                        bin_dir=str(bin_dir) if bin_dir else None,
                        env={**base, **(env or {})}, build=self.build, commit=self.commit)


def _shown(arg: str) -> str:
    return arg if arg and not re.search(r"[\s'\"\\$`]", arg) else repr(arg)


# ------------------------------------------------------------------------------ git
#: The askpass helper: git (and ssh) run it with a prompt; it answers from the
#: environment, and only for the host of the project's URL (a redirect elsewhere gets
#: nothing). The secret is never in the script, an argv or a URL.
_ASKPASS = """#!/bin/sh
case "$1" in
  *"//$CRAWLHUB_GIT_HOST'"*|*"@$CRAWLHUB_GIT_HOST'"*|*"@$CRAWLHUB_GIT_HOST's"*) ;;
  *) echo "crawlhub askpass: credentials are only given to $CRAWLHUB_GIT_HOST" >&2; exit 1 ;;
esac
case "$1" in
  Username*) printf '%s\\n' "$CRAWLHUB_GIT_USERNAME" ;;
  *) printf '%s\\n' "$CRAWLHUB_GIT_PASSWORD" ;;
esac
"""
#: Transports a clone may use (submodules included): never ext:: or fd::.
_ALLOWED_PROTOCOLS = "file:https:http:ssh"


def url_host(url: str) -> str:
    """``host[:port]`` of a git URL as git shows it in prompts ('' for local paths)."""
    if "://" in url:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        return netloc
    m = re.match(r"^(?:[^@/:]+@)?([^:/]+):", url)
    return m.group(1) if m else ""


async def clone(ctx: BuildContext, url: str, ref: str, *, username: str | None = None,
                password: str | None = None, base_env: Mapping[str, str] | None = None
                ) -> str:
    """``git clone --depth 1 --branch <ref> -- <url> <ctx.src>``; the commit checked out.

    Credentials reach git only through ``GIT_ASKPASS`` (and ``SSH_ASKPASS``): a helper
    script in a private temporary directory reading them from its environment. Prompts
    are off (``GIT_TERMINAL_PROMPT=0``), credential helpers are off (nothing is stored),
    only file, http(s) and ssh transports are allowed."""
    env = {k: v for k, v in (os.environ if base_env is None else base_env).items()
           if not k.upper().startswith("CRAWLHUB_")
           and k not in ("GIT_ASKPASS", "SSH_ASKPASS", "SSH_ASKPASS_REQUIRE")}
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": _ALLOWED_PROTOCOLS,
                "GIT_TRACE_REDACT": "1", "GCM_INTERACTIVE": "never", "LC_ALL": "C"})
    env.update({k: ctx.env[k] for k in (ENV_BUILD, ENV_BUILD_OWNER) if k in ctx.env})
    helper_dir: str | None = None
    if username or password:
        helper_dir = tempfile.mkdtemp(prefix="crawlhub-askpass-")  # mode 0700
        script = Path(helper_dir) / "askpass.sh"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, "w") as fh:
            fh.write(_ASKPASS)
        env.update({"GIT_ASKPASS": str(script), "SSH_ASKPASS": str(script),
                    "SSH_ASKPASS_REQUIRE": "force", "CRAWLHUB_GIT_HOST": url_host(url),
                    "CRAWLHUB_GIT_USERNAME": username or "",
                    "CRAWLHUB_GIT_PASSWORD": password or ""})
    try:
        ctx.root.mkdir(parents=True, exist_ok=True)
        argv = ["git", "-c", "credential.helper=", "-c", "advice.detachedHead=false",
                "-c", "protocol.ext.allow=never", "clone", "--depth", "1", "--branch", ref,
                "--", url, str(ctx.src)]
        ctx.say("$ " + " ".join(_shown(a) for a in argv))
        code = await run_process(argv, cwd=ctx.root, env=env, timeout=ctx.remaining(),
                                 write=ctx.log.write)
        if code != 0:
            raise BuildFailed(f"git clone of {ref!r} failed (exit {code}); see the build log")
        lines: list[str] = []
        code = await run_process(["git", "-C", str(ctx.src), "rev-parse", "HEAD"],
                                 cwd=ctx.root, env=env, timeout=ctx.remaining(),
                                 write=lines.append)
        commit = lines[0].strip() if code == 0 and lines else ""
        ctx.commit = commit
        ctx.say(f"cloned {ref} at {commit or '(unknown commit)'}")
        return commit
    finally:
        if helper_dir is not None:
            shutil.rmtree(helper_dir, ignore_errors=True)


# ------------------------------------------------------------------------------ builders
class Builder(Protocol):
    """A way to build: ``name`` (what projects choose), ``Options`` (a pydantic model of
    its options, checked when a project is saved) and ``build``."""

    name: ClassVar[str]
    Options: ClassVar[type[BaseModel]]

    async def build(self, ctx: BuildContext) -> Artifact: ...


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _packaged(src: Path) -> bool:
    return (src / "pyproject.toml").is_file() or (src / "setup.py").is_file()


def _pip_can_target() -> bool:
    """Whether this interpreter's pip can install into another environment
    (``pip --python``, pip >= 22.3)."""
    try:
        from pip import __version__ as version
    except ImportError:
        return False
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]] + [0, 0]
    return (parts[0], parts[1]) >= (22, 3)


def _pip(venv_python: Path, host: bool) -> list[str]:
    head = ([sys.executable, "-m", "pip", "--python", str(venv_python)] if host
            else [str(venv_python), "-m", "pip"])
    return [*head, "--disable-pip-version-check", "--no-input"]


class VenvBuilder:
    """A virtualenv of the tag: the project (``pip install .``) or its requirements
    installed, or nothing for plain scripts."""

    name: ClassVar[str] = "venv"

    class Options(_Options):
        python: str | None = Field(None, description="the interpreter the venv is made"
                                   " from (default: crawlhub's own)")
        system_site_packages: bool = Field(False, description="let the venv see the"
                                           " interpreter's installed packages")
        install: Literal["auto", "project", "requirements", "none"] = Field(
            "auto", description="auto: the project when it has pyproject.toml or"
            " setup.py, else requirements.txt when present, else nothing")
        pip_args: list[str] = Field(default_factory=list, max_length=50,
                                    description="extra arguments of pip install")
        sdk: bool = Field(True, description="make crawlhub importable in the venv, with"
                          " its dependencies and Scrapy as the server has them (a .pth"
                          " naming a directory of links to them, after the venv's own"
                          " packages)")

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        venv = await self._venv(ctx)
        return ctx.artifact("venv", venv, workdir=ctx.src, bin_dir=venv / "bin",
                            env={"VIRTUAL_ENV": str(venv)})

    async def _venv(self, ctx: BuildContext) -> Path:
        opts = self.options
        install = opts.install
        if install == "auto":
            install = ("project" if _packaged(ctx.src) else "requirements"
                       if (ctx.src / "requirements.txt").is_file() else "none")
        if install == "project" and not _packaged(ctx.src):
            raise BuildFailed("install: project, but the tag has no pyproject.toml or"
                              " setup.py")
        if install == "requirements" and not (ctx.src / "requirements.txt").is_file():
            raise BuildFailed("install: requirements, but the tag has no requirements.txt")
        venv = ctx.root / "venv"
        host_pip = _pip_can_target()
        argv = [opts.python or sys.executable, "-m", "venv"]
        if install == "none" or host_pip:
            argv.append("--without-pip")
        if opts.system_site_packages:
            argv.append("--system-site-packages")
        await ctx.run([*argv, str(venv)], what="python -m venv")
        python = venv / "bin" / "python"
        if opts.sdk:  # before the install: what it provides needs no download
            await asyncio.to_thread(sdk_closure)  # read once per process, off the loop
            _link_sdk(ctx, venv)
        if install == "project":
            await ctx.run([*_pip(python, host_pip), "install", *opts.pip_args, "."],
                          what="pip install .")
        elif install == "requirements":
            await ctx.run([*_pip(python, host_pip), "install", *opts.pip_args, "-r",
                           "requirements.txt"], what="pip install -r requirements.txt")
        return venv


#: Packages crawlhub integrates with (``crawlhub.contrib``): a venv gets them, and their
#: commands, from the server when the server has them, as it gets crawlhub's own
#: dependencies - a Scrapy project's job imports what ``CrawlhubControl`` needs.
INTEGRATIONS = ("scrapy",)
#: crawlhub's extras a venv does not get (tools for its own tests).
_DEV_EXTRAS = frozenset({"dev"})
_REQ_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_RE = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_SCRIPT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_OBJECT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def sdk_closure() -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """What a venv's ``sdk/`` links, read once from this interpreter's installed
    distributions: ((top-level name, its path), ...) of crawlhub's requirements (of its
    extras too, but dev), of :data:`INTEGRATIONS`, and of everything they require,
    recursively, as far as installed; and ((command, "module:object"), ...), the
    console scripts of the integrations. crawlhub's own package is linked apart."""
    links: dict[str, str] = {}
    scripts: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str], bool]] = [("crawlhub", frozenset(), True)]
    todo += [(name, frozenset(), False) for name in INTEGRATIONS]
    while todo:
        name, extras, own = todo.pop()
        if (_canonical(name), extras) in seen:
            continue
        seen.add((_canonical(name), extras))
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: the project installs it, or goes without
        for line in dist.requires or ():
            req, _, marker = line.partition(";")
            m = _REQ_RE.match(req)
            if m is None:
                continue
            wanted = _EXTRA_RE.search(marker)
            if wanted and not (wanted.group(1) in extras
                               or (own and wanted.group(1) not in _DEV_EXTRAS)):
                continue
            more = frozenset(e.strip() for e in (m.group(2) or "").split(",") if e.strip())
            todo.append((m.group(1), more, False))
        for file in dist.files or ():
            top = Path(str(file)).parts[0] if str(file) else ""
            if (not top or top in ("..", "__pycache__") or top.endswith(".pth")
                    or top.startswith("__editable__") or (own and top == "crawlhub")):
                continue
            links.setdefault(top, str(dist.locate_file(top)))
        if _canonical(name) in INTEGRATIONS:
            for ep in dist.entry_points.select(group="console_scripts"):
                if _SCRIPT_RE.match(ep.name) and _OBJECT_RE.match(ep.value):
                    scripts.setdefault(ep.name, ep.value)
    return tuple(sorted(links.items())), tuple(sorted(scripts.items()))


_WRAPPER = """#!{python}
# crawlhub: {name} as the server has it (linked in {sdk}); an install of the project's own
# replaces this file
import sys
from {module} import {head}
sys.exit({call}())
"""


def _link_sdk(ctx: BuildContext, venv: Path) -> None:
    """Let the venv import crawlhub, its dependencies and :data:`INTEGRATIONS` as this
    interpreter has them, and nothing else of it: ``root/sdk`` holds links to them (and
    to their ``.dist-info``, so pip counts them installed and downloads none of them), a
    .pth in the venv names it after site-packages (what the project installs itself
    wins), and ``venv/bin`` gets the integrations' commands (``scrapy``). Compiled
    packages only fit the same Python: a venv of another version gets crawlhub alone."""
    import crawlhub

    where = ctx.root / "sdk"
    where.mkdir(parents=True, exist_ok=True)
    link = where / "crawlhub"
    if not link.exists():
        link.symlink_to(Path(crawlhub.__file__).resolve().parent, target_is_directory=True)
    sites = list(venv.glob("lib/python*/site-packages"))
    same = [site for site in sites
            if site.parent.name == f"python{sys.version_info[0]}.{sys.version_info[1]}"]
    if sites and not same:
        ctx.say(f"sdk: the venv's Python is not crawlhub's ({sys.version.split()[0]}):"
                " only crawlhub is linked; the project installs what it needs")
    else:
        links, scripts = sdk_closure()
        for top, target in links:
            entry = where / top
            if not entry.exists() and not entry.is_symlink():
                entry.symlink_to(target, target_is_directory=Path(target).is_dir())
        python = venv / "bin" / "python"
        for name, value in scripts:
            script = venv / "bin" / name
            if script.exists():
                continue
            module, _, obj = value.partition(":")
            script.write_text(_WRAPPER.format(python=python, name=name, sdk=where,
                                              module=module, head=obj.split(".")[0],
                                              call=obj))
            script.chmod(0o755)
        ctx.say(f"sdk: crawlhub and what it needs ({len(links)} entries) linked from the"
                " server's environment into sdk/; the venv's own packages come first")
    for site in sites:
        (site / "crawlhub-sdk.pth").write_text(f"{where}\n")


class WheelBuilder:
    """A wheel of the tag (``pip wheel --no-deps``); a job imports it from ``PYTHONPATH``
    (a pure-Python wheel is importable as it is)."""

    name: ClassVar[str] = "wheel"

    class Options(_Options):
        pip_args: list[str] = Field(default_factory=list, max_length=50,
                                    description="extra arguments of pip wheel")

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        if not _packaged(ctx.src):
            raise BuildFailed("the tag has no pyproject.toml or setup.py: there is nothing"
                              " to build a wheel from (the venv builder takes plain scripts)")
        dist = ctx.root / "dist"
        await ctx.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                       "--no-input", "wheel", "--no-deps", "-w", str(dist),
                       *self.options.pip_args, "."], what="pip wheel")
        wheels = sorted(dist.glob("*.whl"))
        if not wheels:
            raise BuildFailed(f"pip wheel made no .whl file in {dist}")
        return ctx.artifact("wheel", wheels[0], workdir=ctx.src,
                            env={"PYTHONPATH": str(wheels[0])})


_IMAGE_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


def _relative(value: str, what: str) -> str:
    path = Path(value)
    if path.is_absolute() or ".." in path.parts or not value.strip():
        raise ValueError(f"{what} {value!r} must be a path inside the clone (relative, no"
                         " '..')")
    return value


def image_name(project: str) -> str:
    """``crawlhub/<project>`` as Docker allows it (lower case, separators single)."""
    name = re.sub(r"[^a-z0-9]+", "-", project.lower()).strip("-") or "project"
    return f"crawlhub/{name}"


class DockerBuilder:
    """``docker build -t crawlhub/<project>:<version> .`` in the clone, when a Docker
    engine answers ``docker info``."""

    name: ClassVar[str] = "docker"

    class Options(_Options):
        dockerfile: str = Field("Dockerfile", description="relative to the clone")
        image: str | None = Field(None, description="the image's repository name"
                                  " (default crawlhub/<project>)")
        build_args: dict[str, str] = Field(default_factory=dict, max_length=50,
                                           description="--build-arg NAME=VALUE (not for"
                                           " secrets: options are shown)")
        docker: str = Field("docker", description="the docker program")

        @field_validator("dockerfile")
        @classmethod
        def _inside(cls, value: str) -> str:
            return _relative(value, "dockerfile")

        @field_validator("image")
        @classmethod
        def _image(cls, value: str | None) -> str | None:
            if value is not None and not _IMAGE_RE.match(value):
                raise ValueError(f"image {value!r} is not a Docker repository name (lower"
                                 " case letters, digits, '.', '_', '-', '/')")
            return value

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        opts = self.options
        lines: list[str] = []
        try:
            code = await run_process([opts.docker, "info", "--format", "{{.ServerVersion}}"],
                                     cwd=ctx.root, env=ctx.env,
                                     timeout=min(20.0, ctx.remaining()), write=lines.append)
        except BuildFailed as exc:
            code, lines = -1, [str(exc)]
        if code != 0:
            why = next((ln for ln in reversed(lines) if ln.strip()), f"exit {code}")
            ctx.say(f"docker info: {why}")
            raise BuildFailed("no Docker engine answers (docker info failed: "
                              f"{ctx.log.redact(why)[:200]}); start Docker, or choose the venv"
                              " or wheel builder")
        if not (ctx.src / opts.dockerfile).is_file():
            raise BuildFailed(f"the tag has no {opts.dockerfile}")
        tag = f"{opts.image or image_name(ctx.project)}:{re.sub(r'[^A-Za-z0-9_.-]', '_', ctx.version)}"
        argv = [opts.docker, "build", "-t", tag, "-f", opts.dockerfile]
        for name, value in opts.build_args.items():
            argv += ["--build-arg", f"{name}={value}"]
        await ctx.run([*argv, "."], what="docker build")
        return ctx.artifact("image", tag)


class CommandBuilder:
    """The project's own build command (an argv, no shell) run in the clone; the
    directory (or file) ``artifact`` it leaves is the artifact."""

    name: ClassVar[str] = "command"

    class Options(_Options):
        argv: list[str] = Field(min_length=1, max_length=200,
                                description="the command and its arguments (no shell)")
        artifact: str = Field(".", description="what it leaves, relative to the clone")
        kind: Literal["dir", "venv", "wheel"] = Field("dir", description="what that is")

        @field_validator("argv")
        @classmethod
        def _argv(cls, value: list[str]) -> list[str]:
            if not value[0].strip():
                raise ValueError("argv[0] is empty")
            return value

        @field_validator("artifact")
        @classmethod
        def _inside(cls, value: str) -> str:
            return value if value == "." else _relative(value, "artifact")

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        opts = self.options
        await ctx.run(list(opts.argv), env={"CRAWLHUB_BUILD_DIR": str(ctx.root)},
                      what="the build command")
        path = (ctx.src / opts.artifact).resolve()
        if not path.is_relative_to(ctx.root.resolve()) or not path.exists():
            raise BuildFailed(f"the build command left no {opts.artifact!r} in the clone")
        if opts.kind == "venv":
            return ctx.artifact("venv", path, workdir=ctx.src, bin_dir=path / "bin",
                                env={"VIRTUAL_ENV": str(path)})
        if opts.kind == "wheel":
            return ctx.artifact("wheel", path, workdir=ctx.src, env={"PYTHONPATH": str(path)})
        return ctx.artifact("dir", path, workdir=ctx.src)


BUILDERS: dict[str, Any] = {b.name: b for b in (VenvBuilder, WheelBuilder, DockerBuilder,
                                                  CommandBuilder)}


def register(builder: Any) -> None:
    """Add a builder class (``name``, ``Options``, ``__init__(options)``, ``build``)."""
    BUILDERS[builder.name] = builder


def check_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` of builder ``name`` validated (defaults filled); ValueError saying
    what is wrong otherwise."""
    cls = BUILDERS.get(name)
    if cls is None:
        raise ValueError(f"unknown builder {name!r}; use one of {', '.join(sorted(BUILDERS))}")
    try:
        return dict(cls.Options.model_validate(dict(options or {})).model_dump())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
                             for e in exc.errors())
        raise ValueError(f"builder {name!r} options: {problems}") from None


def make_builder(name: str, options: Mapping[str, Any] | None) -> Builder:
    cls = BUILDERS.get(name)
    if cls is None:
        raise BuildFailed(f"unknown builder {name!r}; use one of {', '.join(sorted(BUILDERS))}")
    return cls(cls.Options.model_validate(dict(options or {})))  # type: ignore[no-any-return]


def host_owner() -> str:
    """``host:pid`` of this process: who runs a build."""
    return f"{socket.gethostname()}:{os.getpid()}"

"""One job model for every kind of job (seed 001's cron subprocesses, ``crawlhub crawl``
runs and the collection jobs of ``crawlhub collect``), and the record of a run.

    kind        what runs
    ----------  ------------------------------------------------------------------
    subprocess  ``command`` (an argv list, never a shell line) in the artifact's
                directory, with its virtualenv first on PATH when it has one
    crawl       ``crawlhub crawl`` with ``command`` as its arguments
    collect     a collection job of the config's ``jobs:`` (``crawlhub collect``),
                in the serving process; defined in the config, not through the API

Where a ``subprocess`` or ``crawl`` job runs is its ``runtime``: ``process`` (a child of
the server) or ``container`` (``image``, ``cpus``, ``memory``, ``pids``, ``network``;
crawlhub.control.jobs.container); None takes the server's ``control.runtime``.

Every run gets a row in the runs table: status, exit code, start/end, trigger, host and
pid, the job's counters (``crawlhub.sdk.count``) and its tasks' timeline.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict, Field, field_validator

from crawlhub.core.configtypes import new_list
from crawlhub.core.errors import CrawlhubError
from crawlhub.core.names import check_name

KINDS = ("subprocess", "crawl", "collect")
Kind = Literal["subprocess", "crawl", "collect"]
#: Where a run's program runs (crawlhub.control.jobs.runtime): a child process of the
#: server, or a container (crawlhub.control.jobs.container).
Runtime = Literal["process", "container"]
#: A container's network: none (the default: no network at all), the host's, or the
#: engine's bridge.
Network = Literal["none", "host", "bridge"]
_MEMORY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmg]?$")
#: An image reference: [registry/]name[:tag][@digest], lower-case name.
_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]{0,250}(@sha256:[a-f0-9]{64})?$")

#: Run statuses: queued and running are live; the rest are final.
LIVE = ("queued", "running")
FINAL = ("succeeded", "failed", "cancelled", "timeout", "lost", "skipped")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Environment names a job may not set: the runner's own protocol.
RESERVED_ENV = ("CRAWLHUB_JOB", "CRAWLHUB_RUN", "CRAWLHUB_CONTROL_FILE",
                "CRAWLHUB_COUNTERS_FILE", "CRAWLHUB_RUNNER_PID", "CRAWLHUB_ACK_FILE")
#: Prefixes of the dynamic loader's variables (glibc ld.so, macOS dyld): every one of
#: them (LD_PRELOAD, LD_AUDIT, LD_LIBRARY_PATH, LD_DEBUG_OUTPUT, ...) is refused.
LOADER_ENV_PREFIXES = ("LD_", "DYLD_")
#: Variables that make a program load or run code its command does not name (startup
#: hooks, interpreter options), with what reads them. Refused unless the server's
#: ``control.allowed_env`` lists them (:func:`check_env`). PYTHONPATH, NODE_PATH and
#: PERL5LIB are not here: they only say where imports are found, jobs need them, and
#: whoever sets a job's env sets its command too.
HOOK_ENV = {
    "GCONV_PATH": "glibc's iconv loads modules from it",
    "GLIBC_TUNABLES": "glibc's loader reads it",
    "PYTHONSTARTUP": "Python runs the file it names",
    "PYTHONINSPECT": "Python turns interactive after the script",
    "PYTHONBREAKPOINT": "Python imports and calls what it names",
    "PYTHONHOME": "Python takes its standard library from it",
    "PYTHONUSERBASE": "Python imports usercustomize from it",
    "PYTHONEXECUTABLE": "Python takes it for its own path",
    "PERL5OPT": "Perl reads it as command-line options (-M loads modules)",
    "PERL5DB": "Perl runs it as the debugger",
    "RUBYOPT": "Ruby reads it as command-line options (-r loads files)",
    "NODE_OPTIONS": "Node reads it as command-line options (--require loads files)",
    "JAVA_TOOL_OPTIONS": "the JVM reads it as options (-javaagent loads code)",
    "_JAVA_OPTIONS": "the JVM reads it as options (-javaagent loads code)",
    "JDK_JAVA_OPTIONS": "the java launcher reads it as options",
    "BASH_ENV": "bash runs the file it names before a script",
    "ENV": "sh runs the file it names",
    "SHELLOPTS": "bash takes shell options from it",
    "BASHOPTS": "bash takes shell options from it",
    "PS4": "bash expands it, commands included, when tracing",
    "PROMPT_COMMAND": "bash runs it",
}


class JobEnvError(CrawlhubError, ValueError):
    """A job's ``env`` sets a variable that loads code into its processes (422)."""


def refused_env(name: str, allowed: Iterable[str] = ()) -> str | None:
    """Why ``name`` may not be in a job's env (None: it may), given the names the
    config allows (``control.allowed_env``)."""
    upper = name.upper()
    if upper in {a.upper() for a in allowed}:
        return None
    if upper.startswith(LOADER_ENV_PREFIXES):
        return "the dynamic loader reads it and would load code into every process of the job"
    why = HOOK_ENV.get(upper)
    return f"{why}, code the job's command does not name" if why else None


def check_env(env: Mapping[str, str], allowed: Iterable[str] = (), *,
              job: str = "the job") -> None:
    """:class:`JobEnvError` naming the first variable of ``env`` that loads code (see
    :data:`LOADER_ENV_PREFIXES`, :data:`HOOK_ENV`) and is not in ``allowed``."""
    allowed = list(allowed)
    for name in env:
        why = refused_env(name, allowed)
        if why is not None:
            raise JobEnvError(
                f"env of {job}: {name!r} is refused: {why}. Remove it from the job's env;"
                f" if this server must pass it, its operator lists it in the config:"
                f" control.allowed_env: [{name}]")


def _bad_name(what: str) -> Callable[[Any], ValueError]:
    return lambda name: ValueError(f"{what} name {name!r} must be 1-64 letters, digits, '_',"
                                   " '.' or '-', starting with a letter or digit")


def next_cron_time(cron: str, after: float, tz: str = "UTC") -> float:
    """The first time strictly after ``after`` (unix seconds) that ``cron`` fires."""
    zone = ZoneInfo(tz)
    start = datetime.fromtimestamp(after, zone).replace(microsecond=0)
    fire = next(CronSim(cron, start))
    return fire.timestamp()


class JobSpec(BaseModel):
    """What a user says a job is (``POST /jobs/``, ``crawlhub jobs add``)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Kind = "subprocess"
    #: the project whose build artifact the job runs in (None: the server's directory)
    project: str | None = None
    #: the artifact's version; "latest" is the successful build of the highest version
    version: str | None = None
    #: argv: the program and its arguments (for ``crawl``: the arguments of crawlhub crawl)
    command: list[str] = Field(default_factory=new_list, max_length=1000)
    #: more arguments appended to ``command`` (kept apart so a UI can edit them alone)
    args: list[str] = Field(default_factory=new_list, max_length=1000)
    cron: str | None = None
    #: the zone cron times are read in
    timezone: str = "UTC"
    env: dict[str, str] = Field(default_factory=dict)
    notes: str = Field(default="", max_length=10_000)
    #: seconds a run may take; then it is cancelled and counts as ``timeout``
    timeout: float | None = Field(default=None, gt=0)
    #: runs at once; a cron tick or run request over it is skipped / refused
    max_instances: int = Field(default=1, ge=1, le=1000)
    #: pause by stopping the job's processes (SIGSTOP) at once, not after a second
    #: without the job's acknowledgement (crawlhub.sdk acknowledges)
    pause_signal: bool = False
    #: false: the job is never paused (``POST /jobs/{name}/pause`` answers 409)
    pausable: bool = True
    #: seconds between SIGTERM and SIGKILL on cancel; None: ``control.grace`` (180 s for
    #: a Scrapy command, which closes gracefully on SIGTERM)
    grace: float | None = Field(default=None, gt=0, le=86_400)
    enabled: bool = True
    #: process or container; None: the server's ``control.runtime``
    runtime: Runtime | None = None
    #: container runtime: the image to run, when not the project's build
    image: str | None = None
    #: container runtime: CPUs (1.5 = one and a half), memory (256m, 2g), processes
    cpus: float | None = Field(default=None, gt=0, le=1024)
    memory: str | None = None
    pids: int | None = Field(default=None, ge=8, le=1_000_000)
    network: Network = "none"

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is None:
            return None
        text = value.strip().lower()
        if not _MEMORY_RE.match(text):
            raise ValueError(f"memory {value!r} must be a size like 256m or 2g (b, k, m, g)")
        return text

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not _IMAGE_RE.match(value) or ".." in value:
            raise ValueError(f"image {value[:80]!r} is not an image reference like"
                             " crawlhub/shop:1.4.0 or localhost/base:latest (lower case)")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, NAME_RE, _bad_name("job"))

    @field_validator("project")
    @classmethod
    def _project(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value, NAME_RE, _bad_name("project"))

    @field_validator("command", "args")
    @classmethod
    def _argv(cls, value: list[str]) -> list[str]:
        for arg in value:
            if "\x00" in arg:
                raise ValueError("an argument holds a NUL byte, which no program can receive")
            if len(arg) > 100_000:
                raise ValueError("an argument is over 100,000 characters")
        return value

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = " ".join(value.split())
        try:
            next(CronSim(value, datetime.now(UTC)))
        except (CronSimError, StopIteration, ValueError) as exc:
            raise ValueError(f"cron {value!r} is not a valid cron expression ({exc}); write"
                             " five fields like '*/5 * * * *' (minute hour day month"
                             " weekday)") from None
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {value!r} is not an IANA zone name such as 'UTC'"
                             " or 'Asia/Shanghai'") from None
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"environment name {key!r} must be letters, digits and '_'")
            if key.upper() in RESERVED_ENV:
                raise ValueError(f"environment name {key!r} is set by the runner; choose"
                                 " another")
            if "\x00" in val:
                raise ValueError(f"environment value of {key!r} holds a NUL byte")
        return value

    def argv(self) -> list[str]:
        return [*self.command, *self.args]

    def next_fire(self, after: float | None = None) -> float | None:
        """When cron fires next after ``after`` (now by default); None without cron."""
        if not self.cron:
            return None
        return next_cron_time(self.cron, time.time() if after is None else after,
                              self.timezone)


class JobPatch(BaseModel):
    """``PATCH /jobs/{name}``: the fields to change (the name and kind stay)."""

    model_config = ConfigDict(extra="forbid")

    project: str | None = None
    version: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    cron: str | None = None
    timezone: str | None = None
    env: dict[str, str] | None = None
    notes: str | None = None
    timeout: float | None = None
    max_instances: int | None = None
    pause_signal: bool | None = None
    pausable: bool | None = None
    grace: float | None = None
    enabled: bool | None = None
    runtime: Runtime | None = None
    image: str | None = None
    cpus: float | None = None
    memory: str | None = None
    pids: int | None = None
    network: Network | None = None

    def apply(self, spec: JobSpec) -> JobSpec:
        """``spec`` with these changes, validated like a new job."""
        data = spec.model_dump()
        data.update(self.model_dump(exclude_unset=True))
        return JobSpec.model_validate(data)


class RunRecord(BaseModel):
    """One run of a job, as stored and as ``GET /runs/{id}`` answers."""

    id: str
    job: str
    kind: str
    status: str
    trigger: str
    host: str = ""
    pid: int | None = None
    scheduled_for: float | None = None
    started_at: float
    finished_at: float | None = None
    heartbeat_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    counters: dict[str, Any] = Field(default_factory=dict)
    version: str | None = None
    #: lines of the run's output the log store never got (a bound dropped them while the
    #: store was away); 0 when every line was stored
    log_dropped: int = 0
    #: while the run is paused, how the pause took effect: ``cooperative`` (the job
    #: acknowledged it), ``signal`` (its processes were stopped) or ``frozen`` (its
    #: container paused by the engine); None while it runs
    paused: str | None = None

    @property
    def duration(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at


class TaskRecord(BaseModel):
    """One task of a run's timeline."""

    run: str
    task: str
    status: str
    started_at: float
    finished_at: float | None = None
    detail: str = ""

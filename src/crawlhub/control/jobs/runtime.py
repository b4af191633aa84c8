"""Where a run's program runs: the :class:`Runtime` protocol the runner drives, and the
``process`` runtime (a child process of the server, in its own session).

A runtime starts a run's program and hands back a :class:`JobProcess`: its output as two
streams, its exit, and four verbs the runner uses for control - ``freeze`` / ``thaw``
(pause that does not need the job's help), ``terminate`` (the graceful signal) and
``kill``. The runner keeps everything else (log lines, counters, the cooperative pause,
the grace period, the timeout, the run's record) in one place for every runtime.

The ``container`` runtime is :mod:`crawlhub.control.jobs.container`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from crawlhub.control.builders import Artifact, close_pipes, exited
from crawlhub.control.jobs.model import JobSpec
from crawlhub.core import jobprotocol as protocol

#: Longest line read from a job's output; longer ones are cut (the rest is dropped).
MAX_LINE = 64 * 1024
RUNTIMES = ("process", "container")


class LaunchFailed(Exception):
    """The runtime could not start the run; the message says why and what to do."""


@dataclass(frozen=True)
class Launch:
    """What a runtime needs to start one run."""

    spec: JobSpec
    run: str
    argv: list[str]
    #: the run's own directory on this host (control, counters and ack files)
    workdir: Path
    artifact: Artifact | None = None


class JobProcess(Protocol):
    """A started run, as the runner drives it."""

    #: how ``freeze`` holds it still, stored as the run's ``paused``: ``signal``, ``frozen``
    pause_kind: ClassVar[str]
    #: a host process id for the run's row (the program's, or its engine client's)
    pid: int | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None

    async def wait(self) -> int:
        """Its exit code once it ended (negative: killed by that signal)."""

    async def freeze(self) -> None: ...

    async def thaw(self) -> None: ...

    async def terminate(self) -> None: ...

    async def kill(self) -> None: ...

    async def ended(self, code: int) -> tuple[str | None, str | None]:
        """After :meth:`wait`: a final status that overrides the exit code's (``lost``),
        and why it ended beyond its code (an OOM kill); then the runtime cleans up."""

    def close(self) -> None:
        """Release its pipes (a process it left behind may still hold them)."""


class Runtime(Protocol):
    name: ClassVar[str]

    async def launch(self, launch: Launch) -> JobProcess:
        """Start the run's program (:class:`LaunchFailed` saying why it cannot)."""

    async def stop_orphans(self, run_ids: list[str], grace: float) -> dict[str, str]:
        """Stop what killed servers of this host left running for ``run_ids`` (and
        anything else of theirs); run id -> the outcome, recorded on the run."""


def protocol_env(job: str, run: str, rundir: str) -> dict[str, str]:
    """The job protocol's variables for a run whose directory the job sees at ``rundir``."""
    return {protocol.ENV_JOB: job, protocol.ENV_RUN: run,
            protocol.ENV_CONTROL_FILE: f"{rundir}/control.json",
            protocol.ENV_COUNTERS_FILE: f"{rundir}/counters.json",
            protocol.ENV_ACK_FILE: f"{rundir}/ack.json",
            protocol.ENV_RUNNER_PID: str(os.getpid()),
            "PYTHONUNBUFFERED": "1"}


class ProcessJob:
    """A run as a child process leading its own process group."""

    pause_kind: ClassVar[str] = "signal"

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pid: int | None = process.pid
        self.stdout = process.stdout
        self.stderr = process.stderr

    async def wait(self) -> int:
        return await exited(self.process)

    def _signal(self, sig: signal.Signals) -> None:
        if self.process.returncode is None or sig == signal.SIGKILL:
            signal_group(self.process.pid, sig)

    async def freeze(self) -> None:
        self._signal(signal.SIGSTOP)

    async def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    async def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    async def kill(self) -> None:
        # also after its leader exited: what it left in its group goes too
        self._signal(signal.SIGKILL)

    async def ended(self, code: int) -> tuple[str | None, str | None]:
        return None, None

    def close(self) -> None:
        close_pipes(self.process)


class ProcessRuntime:
    """Runs a job as a child process of the server (``control.runtime: process``): the
    artifact's directory and environment, the server's own user and view of the host."""

    name: ClassVar[str] = "process"

    async def launch(self, launch: Launch) -> ProcessJob:
        artifact, spec = launch.artifact, launch.spec
        if artifact is not None and artifact.workdir is None:
            raise LaunchFailed(
                f"build {artifact.build} of {artifact.project} {artifact.version} is a"
                f" {artifact.kind} ({artifact.path}); the process runtime needs a directory:"
                " use the venv, wheel or command builder, or run the job with runtime:"
                " container")
        cwd = Path(artifact.workdir) if artifact is not None and artifact.workdir \
            else launch.workdir
        env = artifact.environ() if artifact is not None else dict(os.environ)
        env.update(spec.env)
        env.update(protocol_env(spec.name, launch.run, str(launch.workdir)))
        program = launch.argv[0]
        if os.sep not in program and shutil.which(program, path=env.get("PATH")) is None:
            raise LaunchFailed(f"program {program!r} is not on PATH")
        process = await asyncio.create_subprocess_exec(
            *launch.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=str(cwd), env=env,
            start_new_session=True, limit=MAX_LINE)
        return ProcessJob(process)

    async def stop_orphans(self, run_ids: list[str], grace: float) -> dict[str, str]:
        # the runner's /proc scan (Runner.stop_orphans) covers processes
        return {}


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)

"""The processes of a build: one step run with its output captured and its process group
killed when over; a build's leftovers found by their environment (:func:`build_marks`)
and stopped; the environment a build's processes get."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from crawlhub.control.builders.artifact import BuildFailed
from crawlhub.core.redact import secret_names

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


def host_owner() -> str:
    """``host:pid`` of this process: who runs a build."""
    return f"{socket.gethostname()}:{os.getpid()}"

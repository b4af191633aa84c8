"""The job runner: starts a job's process, follows it and records how it ended.

Where the program runs is the job's runtime (``runtime``, else ``control.runtime``;
:mod:`crawlhub.control.jobs.runtime`): ``process``, a child process of the server in its
own session (its own process group, so signals reach its children too), or
``container`` (:mod:`crawlhub.control.jobs.container`), where the same verbs are the
engine's (pause is a cgroup freeze, the run's ``paused`` says ``frozen``). Either way a
run of a ``subprocess`` or ``crawl`` job has:

- the protocol's environment (:mod:`crawlhub.core.jobprotocol`): its job and run codes,
  a control file the runner rewrites whenever the job's desired state changes on the
  control channel (pause / continue / exit), and a counters file it writes;
- its stdout and stderr read line by line into the log store, each line carrying the
  job, run and task codes (a JSON ``{"crawlhub": "task", ...}`` line moves the run's
  timeline instead; the lines of a Python traceback are stored at ``error``). Reading
  waits while the log store is behind, so a job printing faster than the store writes
  is slowed (its pipe fills), never cut; lines a bound had to drop (the store away for
  long) are counted in the run's ``log_dropped``;
- a heartbeat with its counters in the run's row every ``beat`` seconds, so a run whose
  host died is seen as ``lost`` by the next claim.

Pause writes ``pause`` to the control file; a job that acknowledges it within
:data:`~crawlhub.core.jobprotocol.ACK_WAIT` seconds (``crawlhub.sdk`` does) holds still by
itself, any other has its process group stopped (SIGSTOP; SIGCONT on continue). The run's
``paused`` says which (``cooperative`` or ``signal``). ``pause_signal`` jobs are stopped at
once; ``pausable: false`` jobs are never paused (the API answers 409).

Cancel writes ``exit`` to the control file (a job on the SDK ends by itself), sends
SIGTERM to the group once a moment later (at most 2 s), then SIGKILL after the job's
``grace`` seconds (by default ``control.grace``; :data:`SCRAPY_GRACE` for a Scrapy
command, which finishes its requests in flight and closes its exports on SIGTERM). A
``timeout`` counts only running time, not paused time.

A server killed with SIGKILL leaves its job processes behind, re-parented; the next
server to open on the host, or the 30 s sweep of one still running there, stops them
(:meth:`Runner.stop_orphans`: SIGTERM, SIGKILL after ``grace``) and records their runs
``lost``, so no orphan runs on unsupervised, paused or not. A job process is known by its
environment (its run code, and the pid of the server that started it, no longer its
parent); Linux's ``/proc`` tells both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crawlhub.control.builders import (
    READ_TAIL,
    Artifact,
    proc_table,
)
from crawlhub.control.channel import ControlChannel, ControlFollower
from crawlhub.control.jobs.container import ContainerRuntime
from crawlhub.control.jobs.model import JobSpec, RunRecord
from crawlhub.control.jobs.runtime import (
    MAX_LINE,
    JobProcess,
    Launch,
    LaunchFailed,
    ProcessRuntime,
    Runtime,
    signal_group,
)
from crawlhub.control.jobs.store import HOST, JobStore
from crawlhub.control.logs.line import LogLine, level_rank
from crawlhub.core import jobprotocol as protocol
from crawlhub.core.errors import ConflictError
from crawlhub.core.process import pid_alive

if TYPE_CHECKING:
    from crawlhub.collect.service import CollectJobManager

log = logging.getLogger("crawlhub.control.runner")

#: Log lines buffered before a write to the log store (or every FLUSH_EVERY seconds).
FLUSH_LINES = 500
FLUSH_EVERY = 0.2
#: Seconds a Scrapy command gets between SIGTERM and SIGKILL when the job sets no
#: ``grace``: Scrapy's graceful close waits for its requests in flight (its
#: DOWNLOAD_TIMEOUT is 180 s), then closes the spider and its feed exports.
SCRAPY_GRACE = 180.0
#: Seconds at most the end of a run waits for its lines to reach the log store.
LOG_FLUSH_WAIT = 60.0


LogSink = Callable[[list[LogLine]], Awaitable[None]]
#: run code -> its lines the log pipeline dropped (``LogService.dropped_of``)
LogDropped = Callable[[str], int]
LogFlush = Callable[[], Awaitable[None]]
FinishHook = Callable[[JobSpec, RunRecord], Awaitable[None]]
#: (project, version) -> the build's artifact (``BuildService.artifact``)
ArtifactLookup = Callable[[str, str], Awaitable[Artifact]]


@dataclass(slots=True)
class _Live:
    spec: JobSpec
    run: RunRecord
    task: asyncio.Task[RunRecord] | None = None
    process: JobProcess | None = None
    cancelled: str | None = None  # "cancelled" or "timeout" once asked to stop
    paused_since: float | None = None
    paused_total: float = 0.0
    #: the control change of the pause asked (what the job's acknowledgement answers)
    pause_asked: float = 0.0
    #: how the pause took effect: "cooperative", "signal"; None while not (yet) paused
    paused_how: str | None = None
    pausing: asyncio.Task[None] | None = None
    #: stores ``paused_how`` in the run's row, the latest value last
    pause_writer: asyncio.Task[None] | None = None
    ack_file: Path | None = None
    #: lines of this run the runner could not hand to the log sink
    lost_lines: int = 0
    lines_read: int = 0
    emitting: asyncio.Lock = field(default_factory=asyncio.Lock)
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)


class Runner:
    """Runs jobs in this process's host; see the module docstring."""

    def __init__(self, store: JobStore, *, channel: ControlChannel, runs_dir: str | Path,
                 grace: float = 10.0, beat: float = 5.0, log_sink: LogSink | None = None,
                 log_dropped: LogDropped | None = None, log_flush: LogFlush | None = None,
                 artifacts: ArtifactLookup | None = None, on_finish: FinishHook | None = None,
                 collect: CollectJobManager | None = None, clock: Callable[[], float] = time.time,
                 runtime: str = "process", runtimes: Mapping[str, Runtime] | None = None
                 ) -> None:
        self.store = store
        self.channel = channel
        # absolute: a job runs in its own directory, and its control and counters files
        # must name the same files there as here
        self.runs_dir = Path(runs_dir).absolute()
        self.grace = grace
        self.beat = beat
        self.log_sink = log_sink
        #: how many lines of a run the log pipeline dropped, and a flush of what it holds
        self.log_dropped = log_dropped
        self.log_flush = log_flush
        self.artifacts = artifacts
        self.on_finish = on_finish
        #: the collection-job manager (crawlhub.collect.service.CollectJobManager) for ``collect``
        self.collect = collect
        self.clock = clock
        self.live: dict[str, _Live] = {}
        #: the runtimes by name, and the one of jobs that name none (``control.runtime``)
        self.runtimes: dict[str, Runtime] = {
            "process": ProcessRuntime(), "container": ContainerRuntime(env_dir=self.runs_dir)}
        self.runtimes.update(runtimes or {})
        if runtime not in self.runtimes:
            raise ValueError(f"runtime {runtime!r} is not one of {', '.join(self.runtimes)}")
        self.runtime = runtime

    def runtime_of(self, spec: JobSpec) -> str:
        """The runtime ``spec``'s runs use: its own, else the server's."""
        return spec.runtime or self.runtime

    # -- starting -----------------------------------------------------------------------
    async def start(self, spec: JobSpec, *, trigger: str,
                    scheduled_for: float | None = None) -> RunRecord:
        """Claim a run of ``spec`` (ConflictError at ``max_instances``) and start it in
        the background; returns the ``running`` run at once."""
        artifact = None
        if spec.project and spec.kind != "collect":
            if self.artifacts is None:
                raise ConflictError(f"job {spec.name!r} needs project {spec.project!r}'s"
                                    " build, and this server has no build store")
            artifact = await self.artifacts(spec.project, spec.version or "latest")
            if artifact.workdir is None and self.runtime_of(spec) == "process":
                raise ConflictError(
                    f"build {artifact.build} of {spec.project} {artifact.version} is a"
                    f" {artifact.kind} ({artifact.path}); the subprocess runner needs a"
                    " directory: use the venv, wheel or command builder, or run the job"
                    " with runtime: container")
        if await self.channel.get(spec.name) == protocol.EXIT and not self._mine(spec.name):
            # A stale exit request (its runs are over): a new run is not asked to exit.
            await self.channel.set(spec.name, protocol.RUN)
        run = await self.store.claim_run(spec, trigger=trigger, now=self.clock(),
                                         scheduled_for=scheduled_for,
                                         version=artifact.version if artifact else None)
        live = _Live(spec, run)
        self.live[run.id] = live
        live.task = asyncio.create_task(self._run(live, artifact), name=f"run {run.id}")
        return run

    def _mine(self, job: str) -> bool:
        return any(live.spec.name == job for live in self.live.values())

    async def wait(self, run_id: str) -> RunRecord:
        """The run's record once it has ended (a run of another process: as stored)."""
        live = self.live.get(run_id)
        if live is not None and live.task is not None:
            return await asyncio.shield(live.task)
        return await self.store.run(run_id)

    def local_runs(self, job: str | None = None) -> list[RunRecord]:
        return [live.run for live in self.live.values() if job is None or live.spec.name == job]

    # -- stopping -----------------------------------------------------------------------
    def stop_local(self, job: str, *, why: str = "cancelled") -> list[str]:
        """Ask this process's runs of ``job`` to stop (SIGTERM now, SIGKILL after the
        grace period); the ids asked."""
        return [run_id for run_id, live in list(self.live.items())
                if live.spec.name == job and self.stop_run(run_id, why=why)]

    def stop_run(self, run_id: str, *, why: str = "cancelled") -> bool:
        """Ask this process's run ``run_id`` to stop; False when it is not one of them
        (or already asked)."""
        live = self.live.get(run_id)
        if live is None or live.cancelled is not None:
            return False
        live.cancelled = why
        live.stop_requested.set()
        return True

    def grace_of(self, spec: JobSpec) -> float:
        """Seconds between SIGTERM and SIGKILL for ``spec``'s runs: its ``grace``, else
        :data:`SCRAPY_GRACE` for a Scrapy command, else the runner's."""
        if spec.grace is not None:
            return spec.grace
        return max(self.grace, SCRAPY_GRACE) if is_scrapy(spec.argv()) else self.grace

    async def close(self) -> None:
        """Stop every local run gracefully and wait for their records."""
        for run_id in list(self.live):
            self.stop_run(run_id)
        tasks = [live.task for live in self.live.values() if live.task is not None]
        if tasks:
            grace = max(self.grace_of(live.spec) for live in self.live.values())
            await asyncio.wait(tasks, timeout=grace + 5)

    async def stop_orphans(self, run_ids: list[str]) -> dict[str, str]:
        """Stop the job processes of ``run_ids`` that a killed server left running (each
        one's group): SIGTERM (and SIGCONT, should a pause have stopped it), SIGKILL
        after ``grace`` seconds; and the containers of killed servers of this host (every
        runtime's :meth:`~crawlhub.control.jobs.runtime.Runtime.stop_orphans`). Returns
        the runs that had one, each with what happened to it."""
        outcomes: dict[str, str] = {}
        for runtime in self.runtimes.values():
            try:
                outcomes.update(await runtime.stop_orphans(run_ids, self.grace))
            except Exception as exc:  # noqa: BLE001 - the other runtimes' orphans still go
                log.warning("the %s runtime could not stop its orphans: %s", runtime.name, exc)
        orphans = _orphans(set(run_ids))
        if not orphans:
            return outcomes
        for pid, run_id in orphans.items():
            log.warning("run %s: its server is gone but its process %d runs on; stopping it",
                        run_id, pid)
            signal_group(pid, signal.SIGTERM)
            signal_group(pid, signal.SIGCONT)
        deadline = time.monotonic() + self.grace
        while any(pid_alive(pid) for pid in orphans) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for pid in orphans:
            signal_group(pid, signal.SIGKILL)
        for run_id in orphans.values():
            outcomes[run_id] = ("its server ended without recording the end (killed?); the job"
                                " process it left running was stopped by a server on the host")
        return outcomes

    # -- one run ------------------------------------------------------------------------
    async def _run(self, live: _Live, artifact: Artifact | None) -> RunRecord:
        run, spec = live.run, live.spec
        status, exit_code, error, counters = "failed", None, None, None
        try:
            if spec.kind == "collect":
                status, error, counters = await self._collect(live)
            else:
                status, exit_code, error, counters = await self._process(live, artifact)
        except asyncio.CancelledError:
            status, error = "cancelled", "the server stopped"
            raise
        except Exception as exc:  # a run that could not start: its record says why
            log.warning("run %s of job %s failed to run: %s", run.id, spec.name, exc)
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            await self._emit(live, [LogLine(ts=self.clock(), message=error, level="error",
                                            source="control", job=spec.name, run=run.id,
                                            host=HOST)])
        finally:
            for task in (live.pausing, live.pause_writer):
                if task is not None:  # its finish below says the run is not paused
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            now = self.clock()
            with contextlib.suppress(Exception):
                await self.store.finish(run.id, status=status, now=now, exit_code=exit_code,
                                        error=error, counters=counters,
                                        log_dropped=self._dropped(live))
            self.live.pop(run.id, None)
            if not self._mine(spec.name):
                with contextlib.suppress(Exception):
                    if await self.channel.get(spec.name) == protocol.EXIT:
                        await self.channel.set(spec.name, protocol.RUN)
        record = await self.store.run(run.id)
        if self.on_finish is not None:
            try:
                await self.on_finish(spec, record)
            except Exception:
                log.exception("the end-of-run hook of %s failed", run.id)
        return record

    async def _process(self, live: _Live, artifact: Artifact | None
                       ) -> tuple[str, int | None, str | None, dict[str, Any] | None]:
        spec, run = live.spec, live.run
        argv = spec.argv()
        runtime = self.runtimes[self.runtime_of(spec)]
        if spec.kind == "crawl":
            python = sys.executable if runtime.name == "process" else "python3"
            argv = [python, "-m", "crawlhub", "crawl", *argv]
        if not argv:
            return "failed", None, "the job has no command", None
        workdir = self.runs_dir / run.id
        workdir.mkdir(parents=True, exist_ok=True)
        control_file = workdir / "control.json"
        counters_file = workdir / "counters.json"
        live.ack_file = workdir / "ack.json"
        with contextlib.suppress(FileNotFoundError):
            live.ack_file.unlink()  # a restarted run's old acknowledgement answers nothing
        lines: list[LogLine] = []
        # The control file holds the job's desired state before the process starts, so
        # a run of a paused job never takes a step unpaused.
        async with self._follow(live, lines, control_file):
            try:
                process = await runtime.launch(Launch(spec=spec, run=run.id, argv=argv,
                                                      workdir=workdir, artifact=artifact))
            except LaunchFailed as exc:
                return "failed", None, str(exc), None
            live.process = process
            if live.paused_since is not None:  # the job is paused: so is its new run
                self._hold(live)
            await self.store.beat(run.id, self.clock(), pid=process.pid)
            readers = [asyncio.create_task(self._read(live, process.stdout, "stdout", lines)),
                       asyncio.create_task(self._read(live, process.stderr, "stderr", lines))]
            helpers = [asyncio.create_task(self._flush_loop(live, lines)),
                       asyncio.create_task(self._beat_loop(live, counters_file))]
            waiter = asyncio.create_task(process.wait())
            override: str | None = None
            why: str | None = None
            try:
                await self._supervise(live, waiter, control_file)
                code = await waiter
                # the rest of its output: read on while lines come (the reading may be
                # behind, slowed by the log store); a process it left behind in a session
                # of its own may hold the pipes open without writing, so the run ends
                # READ_TAIL s after the last line at most
                while True:
                    seen = live.lines_read
                    done, _ = await asyncio.wait(readers, timeout=READ_TAIL)
                    if len(done) == len(readers) or live.lines_read == seen:
                        break
                override, why = await process.ended(code)
            finally:
                for task in helpers:
                    task.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
                if not waiter.done():  # the server is going down under us
                    await process.kill()
                    waiter.cancel()
                for task in readers:
                    task.cancel()
                process.close()  # a process it left behind may still hold them
                await self._flush(live, lines)
                await self._settle_logs(live)
        counters = _counters(counters_file)
        if live.cancelled == "timeout":
            return "timeout", code, f"ran over its timeout of {spec.timeout:g} s", counters
        if override is not None:
            return override, code, why, counters
        if live.cancelled is not None:
            return "cancelled", code, "cancelled", counters
        if why is not None:
            return "failed", code, why, counters
        if code == 0:
            return "succeeded", code, None, counters
        why = f"exited with code {code}" if code > 0 else f"killed by signal {-code}"
        return "failed", code, why, counters

    async def _supervise(self, live: _Live, waiter: asyncio.Task[int],
                         control_file: Path) -> None:
        """Wait for the process; on a stop request (or the timeout) SIGTERM it, then
        SIGKILL after the grace period."""
        spec, process = live.spec, live.process
        assert process is not None
        while not waiter.done():
            timeout = None
            if spec.timeout is not None and live.paused_since is None:
                ran = self.clock() - live.run.started_at - live.paused_total
                timeout = max(0.0, spec.timeout - ran)
            stop = asyncio.create_task(live.stop_requested.wait())
            done, _ = await asyncio.wait({waiter, stop}, timeout=min(timeout or 1.0, 1.0),
                                         return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if waiter in done:
                return
            if (spec.timeout is not None and live.paused_since is None and live.cancelled is None
                    and self.clock() - live.run.started_at - live.paused_total >= spec.timeout):
                live.cancelled = "timeout"
                live.stop_requested.set()
            if live.stop_requested.is_set():
                break
        if waiter.done():
            return
        _write_control(control_file, protocol.EXIT, self.clock())
        if live.pausing is not None:  # a pause still waiting for its acknowledgement
            live.pausing.cancel()
        if live.paused_since is not None:  # a stopped process cannot handle SIGTERM
            await process.thaw()
        grace = self.grace_of(spec)
        # A job on the SDK sees "exit" in its control file and ends cleanly (its counters
        # flushed): give it a moment before the signal.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), min(2.0, grace / 2))
        if waiter.done():
            return
        # Once: a second SIGTERM (or SIGINT) makes Scrapy, and many tools, stop at once.
        await process.terminate()
        await self._log(live, f"asked to stop ({live.cancelled}): SIGTERM sent; SIGKILL in"
                        f" {grace:g} s", "warning")
        try:
            await asyncio.wait_for(asyncio.shield(waiter), grace)
        except TimeoutError:
            await process.kill()
            await self._log(live, f"still running {grace:g} s after SIGTERM: SIGKILL",
                            "warning")

    async def _read(self, live: _Live, stream: asyncio.StreamReader | None, name: str,
                    lines: list[LogLine]) -> None:
        if stream is None:
            return
        spec, run = live.spec, live.run
        traceback = protocol.TracebackLevel()
        while True:
            try:
                raw = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                raw = exc.partial
                if not raw:
                    return
            except asyncio.LimitOverrunError as exc:
                raw = await stream.read(exc.consumed)
                # drop the rest of the over-long line
                with contextlib.suppress(asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    while True:
                        try:
                            await stream.readuntil(b"\n")
                            break
                        except asyncio.LimitOverrunError as more:
                            await stream.read(more.consumed)
                raw = raw[:MAX_LINE] + b" [line cut]"
            live.lines_read += 1
            text = raw.decode("utf-8", "replace").rstrip("\r\n").replace("\x00", "")
            said = protocol.parse_line(text)
            if isinstance(said, protocol.TaskEvent):
                try:
                    await self.store.task_event(run.id, said.task, said.status, said.ts,
                                                said.detail)
                except Exception:
                    log.exception("recording task %s of run %s failed", said.task, run.id)
                message = f"task {said.task} {said.status}" + (
                    f": {said.detail}" if said.detail else "")
                level = "error" if said.status == "failed" else "info"
                lines.append(LogLine(ts=said.ts, message=message, level=level, job=spec.name,
                                     run=run.id, task=said.task, host=HOST, stream=name))
            else:
                level = said.level
                if traceback.error(said.message) and level_rank(level) < level_rank("error"):
                    level = "error"
                lines.append(LogLine(ts=self.clock(), message=said.message, level=level,
                                     job=spec.name, run=run.id, task=said.task, host=HOST,
                                     stream=name))
            if len(lines) >= FLUSH_LINES:
                await self._flush(live, lines)

    async def _flush_loop(self, live: _Live, lines: list[LogLine]) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            await self._flush(live, lines)

    async def _flush(self, live: _Live, lines: list[LogLine]) -> None:
        # one batch at a time, in order (the lock is FIFO): both readers and the flush
        # loop flush, and a batch may wait for room in the log buffer
        async with live.emitting:
            if not lines:
                return
            batch = lines[:]
            del lines[:len(batch)]
            await self._emit(live, batch)

    async def _emit(self, live: _Live, batch: list[LogLine]) -> None:
        """Hand lines to the log sink; it waits while the store is behind (so the job's
        pipe is read more slowly, and the job is slowed). Lines it refuses are counted."""
        if self.log_sink is None:
            return
        try:
            await self.log_sink(batch)
        except Exception as exc:  # the log store down: the run goes on
            live.lost_lines += len(batch)
            log.warning("%d log lines of run %s not stored: %s", len(batch), live.run.id, exc)

    def _dropped(self, live: _Live) -> int:
        """Lines of the run the log store never got, as far as this process knows."""
        dropped = live.lost_lines
        if self.log_dropped is not None:
            with contextlib.suppress(Exception):
                dropped += self.log_dropped(live.run.id)
        return dropped

    async def _settle_logs(self, live: _Live) -> None:
        """At the run's end: wait (:data:`LOG_FLUSH_WAIT` s at most) until its lines are
        sent, so its record counts what was dropped and ``GET /logs?run=`` shows the rest."""
        if self.log_flush is None:
            return
        try:
            await asyncio.wait_for(self.log_flush(), LOG_FLUSH_WAIT)
        except Exception as exc:  # noqa: BLE001 - the store away: the lines stay buffered
            log.warning("the log lines of run %s are not all stored yet: %s", live.run.id, exc)

    def _line(self, live: _Live, message: str, level: str = "info") -> LogLine:
        """A line the runner itself says about a run."""
        return LogLine(ts=self.clock(), message=message, level=level, source="control",
                       job=live.spec.name, run=live.run.id, host=HOST)

    async def _log(self, live: _Live, message: str, level: str = "info") -> None:
        await self._emit(live, [self._line(live, message, level)])

    def _follow(self, live: _Live, lines: list[LogLine] | None,
                control_file: Path | None = None) -> ControlFollower:
        """Follow the job's desired state while the run lasts: into the control file
        (when there is one), pause / continue (SIGSTOP / SIGCONT for ``pause_signal``
        jobs; paused time does not count against the timeout) and exit (the run is asked
        to stop). Lines saying so go to ``lines``."""

        def changed(change: Any) -> None:
            state = change.state
            if state == protocol.PAUSE and not live.spec.pausable:
                state = protocol.RUN  # never paused: the job opted out (pausable: false)
            if control_file is not None:
                _write_control(control_file, state, change.changed_at)
            note = self._apply(live, state, change.changed_at)
            if note and lines is not None:
                lines.append(self._line(live, note))

        return ControlFollower(self.channel, live.spec.name, on_change=changed)

    def _apply(self, live: _Live, state: str, changed_at: float = 0.0) -> str | None:
        """Act on a desired state; what to log, if anything."""
        process = live.process
        note = None
        if state == protocol.PAUSE and live.paused_since is None:
            live.paused_since = self.clock()
            live.pause_asked = changed_at
            if process is not None:
                self._hold(live)
            elif live.spec.kind == "collect":  # in this process, on the same control
                live.paused_how = "cooperative"
                self._record_pause(live)
            note = "pause asked"
        elif state != protocol.PAUSE and live.paused_since is not None:
            live.paused_total += self.clock() - live.paused_since
            live.paused_since = None
            if live.pausing is not None:
                live.pausing.cancel()
                live.pausing = None
            if live.paused_how in ("signal", "frozen") and process is not None:
                self._background(process.thaw())
            if live.paused_how is not None:
                live.paused_how = None
                self._record_pause(live)
            note = "continued"
        if state == protocol.EXIT and live.cancelled is None:
            live.cancelled = "cancelled"
            live.stop_requested.set()
        return note

    def _hold(self, live: _Live) -> None:
        """Make the pause of a started process take effect: at once by SIGSTOP for a
        ``pause_signal`` job, else by the job's acknowledgement, or SIGSTOP after
        :data:`~crawlhub.core.jobprotocol.ACK_WAIT` seconds without one."""
        if live.pausing is not None or live.paused_how is not None:
            return
        if live.spec.pause_signal:
            self._stop_group(live, "paused: {held} (pause_signal)")
            return
        live.pausing = asyncio.create_task(self._await_ack(live), name=f"pause {live.run.id}")

    async def _await_ack(self, live: _Live) -> None:
        asked = live.pause_asked
        loop = asyncio.get_running_loop()
        deadline = loop.time() + protocol.ACK_WAIT
        while loop.time() < deadline:
            if _acknowledged(live.ack_file, asked):
                live.pausing = None
                live.paused_how = "cooperative"
                self._record_pause(live)
                await self._log(live, "paused: the job acknowledged the pause and holds still")
                return
            await asyncio.sleep(0.05)
        live.pausing = None
        if live.paused_since is None or live.cancelled is not None:
            return
        self._stop_group(live, f"paused: the job did not acknowledge the pause within"
                         f" {protocol.ACK_WAIT:g} s, so {{held}}")

    def _stop_group(self, live: _Live, why: str) -> None:
        """Hold the run still without its help (``why`` is the log line; ``{held}`` in it
        says how)."""
        process = live.process
        if process is None:
            return
        why = why.replace("{held}", _HELD.get(process.pause_kind, process.pause_kind))
        if process.pause_kind == "signal":  # at once, as the signal is sent
            self._background(process.freeze())
            self._paused_by_runtime(live, process, why)
        else:
            self._background(self._freeze(live, process, why))

    async def _freeze(self, live: _Live, process: JobProcess, why: str) -> None:
        """An engine's pause: the run is ``frozen`` once the engine says it is (unless it
        was continued meanwhile; the engine runs the unpause after the pause)."""
        await process.freeze()
        if live.paused_since is not None and live.paused_how is None:
            self._paused_by_runtime(live, process, why)

    def _paused_by_runtime(self, live: _Live, process: JobProcess, why: str) -> None:
        live.paused_how = process.pause_kind
        self._record_pause(live)
        self._background(self._log(live, why))

    @staticmethod
    def _background(coro: Awaitable[None]) -> None:
        """Run ``coro`` from sync code, kept referenced until done."""
        task = asyncio.ensure_future(coro)
        _background.add(task)
        task.add_done_callback(_background.discard)

    def _record_pause(self, live: _Live) -> None:
        """Store how the run's pause took effect (``live.paused_how``) in the background
        (called from sync code): one writer per run, which writes again while the value
        changed meanwhile, so the row ends with the latest; a failure is logged, the next
        change stores it again."""
        if live.pause_writer is None or live.pause_writer.done():
            live.pause_writer = asyncio.create_task(self._write_pause(live))

    async def _write_pause(self, live: _Live) -> None:
        written: object = _UNWRITTEN
        while written != live.paused_how:
            how = live.paused_how
            try:
                await self.store.set_paused(live.run.id, how)
            except Exception as exc:
                log.warning("the pause state of run %s not stored: %s", live.run.id, exc)
                return
            written = how

    async def _beat_loop(self, live: _Live, counters_file: Path) -> None:
        last: dict[str, Any] | None = None
        last_beat = 0.0
        last_dropped = 0
        while True:
            await asyncio.sleep(min(1.0, self.beat))
            # another process asked this run (not its whole job) to stop
            if live.cancelled is None:
                try:
                    if await self.store.stop_asked(live.run.id):
                        self.stop_run(live.run.id)
                except Exception as exc:
                    log.warning("cannot read whether run %s was asked to stop: %s",
                                live.run.id, exc)
            counters = _counters(counters_file)
            dropped = self._dropped(live)
            now = self.clock()
            if counters != last or dropped != last_dropped or now - last_beat >= self.beat:
                try:
                    await self.store.beat(live.run.id, now,
                                          counters if counters != last else None,
                                          log_dropped=dropped if dropped != last_dropped
                                          else None)
                    last, last_beat, last_dropped = counters, now, dropped
                except Exception as exc:
                    log.warning("heartbeat of run %s not stored: %s", live.run.id, exc)

    # -- collection jobs ----------------------------------------------------------------
    async def _collect(self, live: _Live) -> tuple[str, str | None, dict[str, Any] | None]:
        """A collection job through this process's CollectJobManager; its RunResult's counts
        are the run's counters."""
        manager = self.collect
        spec = live.spec
        if manager is None:
            return "failed", "this server has no collection jobs (the config has no 'jobs:')", None
        from crawlhub.sdk import Counters

        workdir = self.runs_dir / live.run.id
        workdir.mkdir(parents=True, exist_ok=True)
        counters_file = workdir / "counters.json"
        counts = Counters(counters_file)
        beat = asyncio.create_task(self._beat_loop(live, counters_file))
        try:
            async with self._follow(live, None) as follower:
                await manager.start(spec.name, control=follower.control, counters=counts)
                waiter = asyncio.create_task(manager.wait(spec.name))
                while not waiter.done():
                    stop = asyncio.create_task(live.stop_requested.wait())
                    await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
                    stop.cancel()
                    if live.stop_requested.is_set() and not waiter.done():
                        await manager.stop(spec.name, wait=True)
                        break
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            counts.flush()
        result = await waiter
        if result is None:
            return "failed", "the collection run left no result", None
        data = result.to_dict()
        counters = {"requests_ok": data["requests"]["ok"],
                    "requests_failed": data["requests"]["failed"],
                    "requests_retried": data["requests"]["retried"],
                    "items": data["records"]["written"],
                    "records_processed": data["records"]["processed"],
                    "records_failed": data["records"]["failed"]}
        status = str(data.get("status", "FAILED")).upper()
        if live.cancelled is not None or status == "CANCELLED":
            return "cancelled", data.get("reason") or "cancelled", counters
        if status == "SUCCEEDED":
            return "succeeded", None, counters
        return "failed", str(data.get("reason") or f"collection run ended {status}"), counters


#: tasks started from sync code, kept referenced until done
_background: set[asyncio.Future[None]] = set()
#: how a runtime's freeze holds a run still, as the log says it
_HELD = {"signal": "its processes were stopped (SIGSTOP; SIGCONT on continue)",
         "frozen": "its container was frozen (the engine's pause, a cgroup freeze;"
                   " unpause on continue)"}
#: what ``_write_pause`` has stored before its first write (unequal to every value)
_UNWRITTEN = object()


def is_scrapy(argv: list[str]) -> bool:
    """Whether ``argv`` runs Scrapy: ``scrapy ...`` or ``python -m scrapy ...``."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == "scrapy":
        return True
    return len(argv) >= 3 and argv[1] == "-m" and argv[2] == "scrapy"


def _acknowledged(path: Path | None, asked: float) -> bool:
    """Whether the job's ack file answers the pause asked at ``asked``."""
    if path is None:
        return False
    data = protocol.read_json(path, max_bytes=4096)  # no acknowledgement is that long
    return (isinstance(data, dict) and data.get("state") == protocol.PAUSE
            and data.get("changed_at") == asked)


def _write_control(path: Path, state: str, now: float) -> None:
    with contextlib.suppress(OSError):
        protocol.write_json_atomic(path, {"state": state, "changed_at": now})


def _counters(path: Path) -> dict[str, Any] | None:
    data = protocol.read_json(path)
    if isinstance(data, dict) and isinstance(data.get("counters"), Mapping):
        return {str(k): v for k, v in data["counters"].items()
                if isinstance(v, int | float | str) and not isinstance(v, bool)}
    return None


def _orphans(run_ids: set[str]) -> dict[int, str]:
    """The live processes of this user that are job processes of ``run_ids`` whose
    server is gone: pid -> run code. A job process is known by its environment (the
    run's code and the pid of the server that started it) and by leading its own
    process group (the runner starts each in a new session; the processes it starts
    do not lead one, unless they make their own). Its server is gone when that pid
    is no longer alive (should a new process have taken the pid, the orphan is missed,
    never a live server's job stopped). Reads Linux's ``/proc``; elsewhere, none."""
    found: dict[int, str] = {}
    if not run_ids:
        return found
    wanted = {run_id.encode(): run_id for run_id in run_ids}
    for pid, environ, _state, group in proc_table():
        env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        run_id = wanted.get(env.get(protocol.ENV_RUN.encode(), b""))
        if run_id is None or group != pid:
            continue
        try:
            runner = int(env.get(protocol.ENV_RUNNER_PID.encode(), b""))
        except ValueError:
            continue
        if not pid_alive(runner):
            found[pid] = run_id
    return found


"""The ``container`` runtime: a run is an OCI container run by the podman (or docker) CLI.

Why the CLI, not docker-py or podman-py: both need a service answering the Docker API
(``podman system service`` or dockerd), one more daemon to start, watch and secure;
podman needs none (each container has its own monitor, conmon), and ``podman run``
attached gives the run's stdout, stderr and exit code through one child process, the same
shape as the process runtime. ``docker`` takes the same arguments (``control.engine``).

A run's container (``crawlhub-<run id>``):

- its image: the job's ``image:``, else its project build's image (the ``image``
  builder), else ``control.container_image``;
- labels ``crawlhub.job``, ``crawlhub.run``, ``crawlhub.server`` (``host:pid`` of the
  server that started it) and ``crawlhub.host``, so a server restarted after a SIGKILL
  finds what its predecessor left (:meth:`ContainerRuntime.stop_orphans`);
- a read-only root filesystem, a tmpfs on ``/tmp``, and the run's own directory of this
  host bind-mounted at ``/crawlhub/run`` (the per-run volume: the protocol's control,
  counters and ack files, and whatever the job writes there);
- crawlhub's own package bind-mounted read-only at ``/opt/crawlhub`` (on ``PYTHONPATH``):
  the SDK a job imports is always the server's, so both speak the same protocol, and any
  image with a Python works, a plain ``image:`` one included. The SDK needs the standard
  library only;
- an unprivileged user (``control.container_user``, nobody by default), no capabilities,
  ``no-new-privileges``, a minimal init as PID 1 (signals reach the job), ``cpus``,
  ``memory`` and ``pids`` limits, network ``none`` unless the job says ``host`` or
  ``bridge``;
- the job's ``env`` (checked like a process job's) and the protocol's variables through
  an env file readable by the server only: never the server's own environment, and
  never on an argv where ``ps`` shows it.

Pause is the engine's (``podman pause``: the cgroup freezer), after the SDK's cooperative
pause where the job speaks it; cancel is SIGTERM, SIGKILL after the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar

import crawlhub
from crawlhub.control.builders import close_pipes, exited
from crawlhub.control.jobs.runtime import MAX_LINE, Launch, LaunchFailed, protocol_env
from crawlhub.control.jobs.store import HOST
from crawlhub.core.process import pid_alive

log = logging.getLogger("crawlhub.control.container")

#: Where a container sees its run's directory, and crawlhub's package.
RUN_MOUNT = "/crawlhub/run"
SDK_MOUNT = "/opt/crawlhub"
LABEL_JOB, LABEL_RUN = "crawlhub.job", "crawlhub.run"
LABEL_SERVER, LABEL_HOST = "crawlhub.server", "crawlhub.host"
#: Exit codes of ``podman run`` / ``docker run`` itself (not of the job): the engine
#: failed, the command cannot be invoked, the command was not found.
ENGINE_CODES = (125, 126, 127)
#: Seconds an engine command (pause, inspect, rm, ...) may take.
ENGINE_TIMEOUT = 60.0
_INIT = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit", "/usr/bin/tini")


class EngineError(Exception):
    """An engine command failed; the message holds its error."""


def container_name(run: str) -> str:
    return f"crawlhub-{run}"


async def engine_call(engine: str, *args: str, timeout: float = ENGINE_TIMEOUT
                      ) -> tuple[int, str, str]:
    """Run ``engine args``; (exit code, stdout, stderr)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            engine, *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        raise EngineError(f"cannot run {engine}: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise EngineError(f"{engine} {args[0]} took over {timeout:g} s") from None
    return (proc.returncode or 0, out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"))


class ContainerJob:
    """A run as an attached ``podman run`` client: its pipes are the container's output,
    its exit code the container's."""

    pause_kind: ClassVar[str] = "frozen"

    def __init__(self, runtime: ContainerRuntime, name: str, process: asyncio.subprocess.Process,
                 env_file: Path, memory: str | None) -> None:
        self.runtime = runtime
        self.name = name
        self.process = process
        self.pid: int | None = process.pid
        self.stdout = process.stdout
        self.stderr = process.stderr
        self.env_file = env_file
        self.memory = memory
        #: SIGKILL sent by the runner (an exit 137 is then not the OOM killer's)
        self.killed = False
        # engine commands run one at a time, in the order asked (pause before continue)
        self._lock = asyncio.Lock()

    async def wait(self) -> int:
        return await exited(self.process)

    async def _do(self, *args: str) -> None:
        async with self._lock:
            if self.process.returncode is not None:
                return
            try:
                code, _, err = await engine_call(self.runtime.engine, *args, self.name)
            except EngineError as exc:
                code, err = -1, str(exc)
            if code != 0 and self.process.returncode is None:
                log.warning("%s %s %s: %s", self.runtime.engine, args[0], self.name,
                            err.strip()[:300])

    async def freeze(self) -> None:
        await self._do("pause")

    async def thaw(self) -> None:
        await self._do("unpause")

    async def terminate(self) -> None:
        await self._do("kill", "--signal", "TERM")

    async def kill(self) -> None:
        self.killed = True
        await self._do("kill", "--signal", "KILL")

    async def ended(self, code: int) -> tuple[str | None, str | None]:
        """Read the container's end (OOM kill, or vanished), then remove it."""
        try:
            return await self._why(code)
        finally:
            with contextlib.suppress(OSError):
                self.env_file.unlink()
            with contextlib.suppress(EngineError):
                await engine_call(self.runtime.engine, "rm", "-f", "-t", "0", self.name)

    async def _why(self, code: int) -> tuple[str | None, str | None]:
        try:
            rc, out, err = await engine_call(self.runtime.engine, "inspect", "--type",
                                             "container", self.name)
        except EngineError as exc:
            return "lost", f"the container engine did not answer about {self.name}: {exc}"
        if rc != 0:
            if code in ENGINE_CODES:
                return None, (f"the container engine could not start {self.name} (exit"
                              f" {code}); its error is in the run's log")
            return "lost", (f"its container {self.name} vanished while it ran (removed, or"
                            f" the container engine was reset): {err.strip()[:200]}")
        state = (json.loads(out) or [{}])[0].get("State", {})
        if state.get("OOMKilled") or (code == 137 and self.memory and not self.killed
                                      and _kernel_oom(state.get("CgroupPath") or self.name,
                                                      (json.loads(out) or [{}])[0].get("Id", ""))):
            return None, (f"OOM-killed: it reached its memory limit of {self.memory} and the"
                          " kernel killed it (exit 137); raise the job's memory")
        if code == 137 and self.memory and not self.killed:
            return None, (f"killed by SIGKILL (exit 137) while it had a memory limit of"
                          f" {self.memory}: most likely OOM-killed (the engine and the kernel"
                          " log do not say)")
        return None, None

    def close(self) -> None:
        close_pipes(self.process)


def _kernel_oom(cgroup: str, container_id: str) -> bool:
    """Whether the kernel log says the OOM killer acted in the container's cgroup (the
    engine's ``OOMKilled`` is not always set: podman 4 on cgroup v1 leaves it false).
    False when the log is not readable (``/dev/kmsg`` needs root)."""
    marks = [m.encode() for m in (container_id, cgroup) if m and len(m) >= 12]
    if not marks:
        return False
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        for _ in range(100_000):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not record:
                break
            if b"oom" in record.lower() and any(m in record for m in marks):
                return True
    finally:
        os.close(fd)
    return False


class ContainerRuntime:
    """Runs jobs as containers (``runtime: container``); see the module docstring."""

    name: ClassVar[str] = "container"

    def __init__(self, engine: str = "podman", *, default_image: str | None = None,
                 user: str = "65534:65534", tmpfs_size: str = "64m",
                 env_dir: str | Path | None = None) -> None:
        self.engine = engine
        self.default_image = default_image
        self.user = user
        self.tmpfs_size = tmpfs_size
        #: where env files are written (0600, never mounted in a container)
        self.env_dir = Path(env_dir) if env_dir is not None else None
        self.server = f"{HOST}:{os.getpid()}"
        self.sdk_dir = Path(crawlhub.__file__).resolve().parent

    def available(self) -> str | None:
        """Why no container can run here (None: the engine's program is there)."""
        if shutil.which(self.engine) is None:
            return (f"the container engine {self.engine!r} is not on PATH: install podman"
                    " (apt-get install podman runc), or set control.engine")
        return None

    def image_of(self, launch: Launch) -> str:
        spec, artifact = launch.spec, launch.artifact
        if spec.image:
            return spec.image
        if artifact is not None:
            if artifact.kind != "image":
                raise LaunchFailed(
                    f"build {artifact.build} of {artifact.project} {artifact.version} is a"
                    f" {artifact.kind}, and a container runs an image: build the project with"
                    " the image builder, give the job an image:, or run it with runtime:"
                    " process")
            return artifact.path
        if self.default_image:
            return self.default_image
        raise LaunchFailed(f"job {spec.name!r} runs in a container but names no image: give"
                           " it image: (or a project built by the image builder), or set"
                           " control.container_image")

    async def launch(self, launch: Launch) -> ContainerJob:
        why = self.available()
        if why:
            raise LaunchFailed(why)
        spec, run = launch.spec, launch.run
        image = self.image_of(launch)
        env = dict(launch.artifact.env) if launch.artifact is not None else {}
        env.update(spec.env)
        env.update(protocol_env(spec.name, run, RUN_MOUNT))
        env["PYTHONPATH"] = ":".join(p for p in (spec.env.get("PYTHONPATH"), SDK_MOUNT) if p)
        env.setdefault("HOME", "/tmp")
        for key, value in env.items():
            if "\n" in value or "\r" in value:
                raise LaunchFailed(f"env {key!r} of job {spec.name!r} holds a line break,"
                                   " which a container's environment cannot carry")
        env_dir = self.env_dir or launch.workdir.parent
        env_dir.mkdir(parents=True, exist_ok=True)
        env_file = env_dir / f".{run}.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("".join(f"{k}={v}\n" for k, v in env.items()))
        self._own(launch.workdir)
        name = container_name(run)
        argv = [self.engine, "run", "--name", name,
                "--label", f"{LABEL_JOB}={spec.name}", "--label", f"{LABEL_RUN}={run}",
                "--label", f"{LABEL_SERVER}={self.server}", "--label", f"{LABEL_HOST}={HOST}",
                "--read-only", "--tmpfs",
                f"/tmp:rw,size={self.tmpfs_size},mode=1777",
                "-v", f"{launch.workdir}:{RUN_MOUNT}:rw",
                "-v", f"{self.sdk_dir}:{SDK_MOUNT}/crawlhub:ro",
                "--env-file", str(env_file), "--user", self.user,
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--network", spec.network, "--stop-timeout", "1"]
        if any(os.path.exists(p) for p in _INIT):
            argv.append("--init")
        if spec.image is None and launch.artifact is None:
            argv += ["--workdir", RUN_MOUNT]
        if spec.cpus is not None:
            argv += ["--cpus", f"{spec.cpus:g}"]
        if spec.memory is not None:
            argv += ["--memory", spec.memory, "--memory-swap", spec.memory]
        if spec.pids is not None:
            argv += ["--pids-limit", str(spec.pids)]
        argv += [image, *launch.argv]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=MAX_LINE)
        except OSError as exc:
            with contextlib.suppress(OSError):
                env_file.unlink()
            raise LaunchFailed(f"cannot run {self.engine}: {exc.strerror or exc}") from None
        return ContainerJob(self, name, process, env_file, spec.memory)

    def _own(self, workdir: Path) -> None:
        """Let the container's user write the run's directory (the server may be root,
        the container's user is not)."""
        user = self.user.split(":")
        if os.geteuid() != 0 or not all(part.isdigit() for part in user):
            return
        uid, gid = int(user[0]), int(user[1] if len(user) > 1 else user[0])
        with contextlib.suppress(OSError):
            os.chown(workdir, uid, gid)

    async def containers(self) -> list[dict[str, Any]]:
        """crawlhub's containers on this host (any state): their ``podman ps`` rows."""
        if self.available():
            return []
        code, out, err = await engine_call(self.engine, "ps", "-a", "--filter",
                                           f"label={LABEL_HOST}={HOST}", "--format", "json")
        if code != 0:
            raise EngineError(f"{self.engine} ps: {err.strip()[:300]}")
        rows = json.loads(out or "[]") or []
        return [row for row in rows if isinstance(row, dict)]

    async def stop_orphans(self, run_ids: list[str], grace: float) -> dict[str, str]:
        """The containers of this host's dead servers: running or paused ones are stopped
        (SIGTERM, SIGKILL after ``grace``), every one is removed; run id -> what happened,
        for the runs in ``run_ids``."""
        try:
            rows = await self.containers()
        except EngineError as exc:
            log.warning("cannot list the containers of dead servers: %s", exc)
            return {}
        outcomes: dict[str, str] = {}
        orphans = []
        for row in rows:
            server = str((row.get("Labels") or {}).get(LABEL_SERVER, ""))
            owner = server.rpartition(":")[2]
            if owner.isdigit() and (int(owner) == os.getpid() or pid_alive(int(owner))):
                continue  # a live server's (this one's, or another on the host)
            orphans.append(row)
        # at once: each may take its grace period
        done = await asyncio.gather(*(self._stop_orphan(row, grace) for row in orphans),
                                    return_exceptions=True)
        for row, outcome in zip(orphans, done, strict=True):
            run = str((row.get("Labels") or {}).get(LABEL_RUN, ""))
            if isinstance(outcome, BaseException):
                log.warning("cannot stop the container of run %s: %s", run, outcome)
            elif run in run_ids:
                outcomes[run] = outcome
        return outcomes

    async def _stop_orphan(self, row: dict[str, Any], grace: float) -> str:
        """Stop (when it runs) and remove a dead server's container; what happened."""
        labels = row.get("Labels") or {}
        server = str(labels.get(LABEL_SERVER, ""))
        names = row.get("Names") or [row.get("Id", "")]
        name = str(names[0] if isinstance(names, list) else names)
        run = str(labels.get(LABEL_RUN, ""))
        state = str(row.get("State", "")).lower()
        if state in ("running", "paused"):
            log.warning("run %s: its server %s is gone but its container %s runs on;"
                        " stopping it", run, server, name)
            if state == "paused":
                await engine_call(self.engine, "unpause", name)
            await engine_call(self.engine, "stop", "-t", f"{max(grace, 0):.0f}", name,
                              timeout=grace + ENGINE_TIMEOUT)
            why = (f"its server ({server}) was killed while its container {name} ran;"
                   " a server on the host stopped the container and removed it")
        else:
            why = (f"its server ({server}) was killed; its container {name} had ended"
                   f" meanwhile (exit {row.get('ExitCode')}) and was removed")
        await engine_call(self.engine, "rm", "-f", "-t", "0", name)
        if self.env_dir is not None:
            with contextlib.suppress(OSError):
                (self.env_dir / f".{run}.env").unlink()
        return why


"""Builds: a project's tag (or branch) cloned fresh and built into an artifact, in the
background, with its log, commit, status and artifact recorded on the control database.

    build = await service.start("shop", tag="release/shop/1.4.0", trigger="hook")
    build = await service.wait(build.id)
    artifact = await service.artifact("shop", "1.4.0")   # what a job runs

One build per project and version at a time (a second is a ``ConflictError``); at most
``parallel`` builds of this process run at once, the rest wait ``queued``. A build's row
names the process running it (``host:pid``) and is touched while it runs, so a build left
``running`` by a process that died (SIGKILL, a crash, a reboot) is marked failed
("interrupted") the next time a :class:`BuildService` opens, or as soon as another build of
the same version is asked for; what its steps left running on this host (``pip``, a
``setup.py``, found by their environment) is killed and its half-made directory removed.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import re
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, Field

from crawlhub.control.builders import (
    Artifact,
    BuildContext,
    BuildFailed,
    BuildLog,
    Redactor,
    build_marks,
    clone,
    host_owner,
    make_builder,
    scrubbed_environ,
    stop_leftovers,
)
from crawlhub.control.db import ControlDB, Tx
from crawlhub.control.projects import (
    InvalidProject,
    Project,
    ProjectStore,
    check_found,
    check_ref,
)
from crawlhub.control.secrets import SecretBox
from crawlhub.control.versions import highest, version_key
from crawlhub.core.errors import ConflictError, CrawlhubError, NotFoundError
from crawlhub.core.process import pid_alive

if TYPE_CHECKING:
    from crawlhub.control.config import ControlSection

log = logging.getLogger("crawlhub.control.builds")

Status = Literal["queued", "running", "succeeded", "failed"]
STATUSES: tuple[Status, ...] = get_args(Status)
TRIGGERS = ("hook", "api", "cli", "scrapyd")
#: A version: one path component (it names a directory and a Docker tag).
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
LATEST = "latest"


class Build(BaseModel):
    """One build: what was built, how it went, and the artifact it left."""

    id: int
    project: str
    tag: str | None = Field(description="the release tag built (null: a branch)")
    ref: str = Field(description="the tag or branch cloned")
    version: str
    commit: str | None = Field(description="the commit the clone checked out")
    status: Status
    builder: str
    trigger: str = Field(description="hook, api, cli or scrapyd")
    artifact_kind: str | None = Field(description="dir, venv, wheel, image or egg")
    artifact_path: str | None = Field(description="the venv, wheel, image tag or directory")
    artifact_meta: dict[str, Any] = Field(default_factory=dict, description="an image's"
                                          " id and size (bytes)")
    error: str | None = Field(description="why it failed")
    created: float
    started: float | None
    finished: float | None
    log: str | None = Field(None, description="its output, the last lines (only on"
                            " GET /builds/{id})")

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed")


def check_version(version: str) -> str:
    if not isinstance(version, str) or not VERSION_RE.match(version) or version == LATEST:
        shown = version[:80] if isinstance(version, str) else ""
        raise InvalidProject(f"version {shown!r} is not valid: 1 to 64 letters, digits, '.',"
                             " '_', '+' or '-', starting with a letter or digit, and not"
                             f" {LATEST!r}")
    return version


#: The builds running in this process, by database table and id. A row naming this
#: process (``host:pid``) whose build is not here was left by an earlier process that had
#: the same pid: a container's server is pid 1 at every start.
_RUNNING: set[tuple[str, int]] = set()


def _local_pid(owner: str | None) -> int | None:
    """The pid of a build's ``owner`` (``host:pid``, :func:`host_owner`) when it is of
    this host; None: another host's, or unknown."""
    host, _, pid = (owner or "").rpartition(":")
    return int(pid) if host == socket.gethostname() and pid.isdigit() else None


_COLUMNS = ("id, project, tag, ref, version, commit_sha, status, builder, trigger,"
            " artifact, error, created, started, finished")


class BuildService:
    """Builds of the projects in ``projects``; directories under ``builds_dir``."""

    def __init__(self, db: ControlDB, projects: ProjectStore, *, builds_dir: str | Path,
                 timeout: float = 900.0, log_lines: int = 5000, parallel: int = 2,
                 flush_every: float = 1.0, stale_after: float = 120.0) -> None:
        self.db = db
        self.projects = projects
        self.table = db.table("builds")
        # absolute: git runs in the build's directory, and artifacts are found from anywhere
        self.builds_dir = Path(builds_dir).resolve()
        self.timeout = timeout
        self.log_lines = log_lines
        self.flush_every = flush_every
        self.stale_after = stale_after
        self.owner = host_owner()
        self._slots = asyncio.Semaphore(parallel)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._closed = False

    @classmethod
    async def open(cls, db: ControlDB, projects: ProjectStore, **kwargs: Any) -> BuildService:
        service = cls(db, projects, **kwargs)
        await service.create_schema()
        await service.recover()
        return service

    @classmethod
    async def open_section(cls, db: ControlDB, secrets: SecretBox,
                           section: ControlSection) -> BuildService:
        """The projects (``.projects``) and builds of the ``control`` config section."""
        projects = await ProjectStore.open(db, secrets, tag_pattern=section.tag_pattern,
                                           builder=section.builder)
        return await cls.open(db, projects, builds_dir=section.builds_dir,
                              timeout=float(section.build_timeout),
                              log_lines=section.build_log_lines,
                              parallel=section.builds_parallel)

    async def create_schema(self) -> None:
        key = ("id INTEGER PRIMARY KEY AUTOINCREMENT" if self.db.dialect == "sqlite"
               else "id BIGSERIAL PRIMARY KEY")
        t = self.table
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {t} ({key}, project TEXT NOT NULL, tag TEXT,"
            " ref TEXT NOT NULL, version TEXT NOT NULL, commit_sha TEXT,"
            " status TEXT NOT NULL, builder TEXT NOT NULL, trigger TEXT NOT NULL,"
            " artifact TEXT, error TEXT, log TEXT, owner TEXT,"
            " beat DOUBLE PRECISION, created DOUBLE PRECISION NOT NULL,"
            " started DOUBLE PRECISION, finished DOUBLE PRECISION)",
            f"CREATE INDEX IF NOT EXISTS {t}_project ON {t} (project, id)",
            f"CREATE INDEX IF NOT EXISTS {t}_status ON {t} (status, id)",
            f"CREATE INDEX IF NOT EXISTS {t}_version ON {t} (project, version, status)",
        ])

    # -- starting ----------------------------------------------------------------------
    async def start(self, project: str, *, tag: str | None = None, ref: str | None = None,
                    version: str | None = None, trigger: str = "api",
                    watch: Callable[[str], None] | None = None) -> Build:
        """Queue a build of ``tag`` (its version read from the project's tag pattern
        unless given) or of branch ``ref`` (default: the project's default branch; then
        ``version`` is required) and run it in the background.

        ``NotFoundError``: no such project; ``ConflictError``: a build of that version is
        under way; ``InvalidProject``: a bad tag, ref or version. ``watch`` sees every
        log line (masked) as it comes."""
        if self._closed:
            raise ConflictError("the build service is closing; start the build again later")
        if trigger not in TRIGGERS:
            raise InvalidProject(f"trigger {trigger!r}: one of {', '.join(TRIGGERS)}")
        proj = await self.projects.get(project)
        if not proj.git_url:
            raise InvalidProject(f"project {project!r} has no git remote: its versions are"
                                 " uploaded (Scrapyd's addversion.json); PATCH a git_url to"
                                 " build its tags")
        if tag is not None and ref is not None:
            raise InvalidProject("give a tag or a ref, not both")
        if tag is not None:
            check_ref(tag, "tag")
            if version is None:
                version, why = proj.release(tag)
                if version is None:
                    raise InvalidProject(f"{why}; give a version to build it anyway")
            ref = tag
        else:
            ref = check_ref(ref or proj.default_branch, "ref")
            if version is None:
                raise InvalidProject(f"building branch {ref!r} needs a version (a release"
                                     " tag gives its own)")
        check_version(version)
        now = time.time()
        abandoned: list[tuple[int, str | None]] = []
        build_id = await self.db.transaction(
            lambda tx: self._insert(tx, proj, tag, ref, version, trigger, now, abandoned),
            lock=f"build:{project}")
        # this process's from now: while the old one's leftovers are cleared, a recover
        # or a delete_project must not take the new row for abandoned
        _RUNNING.add(self._key(build_id))
        try:
            for old_id, owner in abandoned:
                await self._clear(old_id, project, version, owner)
        except BaseException:
            _RUNNING.discard(self._key(build_id))
            raise
        task = asyncio.create_task(self._run(build_id, proj, ref, version, watch),
                                   name=f"build {build_id} {project} {version}")
        self._tasks[build_id] = task

        def forget(_task: asyncio.Task[None]) -> None:
            self._tasks.pop(build_id, None)
            _RUNNING.discard(self._key(build_id))

        task.add_done_callback(forget)
        log.info("build %d of %s %s queued (%s, %s)", build_id, project, version, ref, trigger)
        return await self.get(build_id, with_log=False)

    async def _insert(self, tx: Tx, proj: Project, tag: str | None, ref: str, version: str,
                      trigger: str, now: float, abandoned: list[tuple[int, str | None]],
                      builder: str | None = None) -> int:
        rows = await tx.fetch(
            f"SELECT id, status, owner, beat FROM {self.table}"
            " WHERE project = $1 AND version = $2 AND status IN ('queued', 'running')",
            proj.name, version)
        for build_id, status, owner, beat in rows:
            if self._abandoned(int(build_id), owner, beat, now):
                await self._interrupt(tx, build_id, owner, now)
                abandoned.append((int(build_id), owner))
                continue
            raise ConflictError(f"build {build_id} of {proj.name} {version} is {status}: one"
                                " build per project and version at a time; wait for it")
        got = await tx.fetch(
            f"INSERT INTO {self.table} (project, tag, ref, version, status, builder,"
            " trigger, owner, beat, created) VALUES"
            " ($1, $2, $3, $4, 'queued', $5, $6, $7, $8, $8) RETURNING id",
            proj.name, tag, ref, version, builder or proj.builder.name, trigger, self.owner,
            now)
        return int(got[0][0])

    async def record(self, project: str, version: str,
                     make: Callable[[Path, BuildLog], Awaitable[Artifact]], *,
                     trigger: str, builder: str, ref: str) -> Build:
        """A build made in this process by ``make`` instead of from a clone (an egg
        uploaded through Scrapyd's ``addversion.json``), under the same rules as any: one
        build per project and version at a time (``ConflictError``), a row that says how
        it went. ``make(root, log)`` fills the fresh directory ``root`` and returns the
        artifact; when it raises, the build is recorded failed, ``root`` is removed and
        the error goes on to the caller. The finished build."""
        if self._closed:
            raise ConflictError("the build service is closing; upload again later")
        if trigger not in TRIGGERS:
            raise InvalidProject(f"trigger {trigger!r}: one of {', '.join(TRIGGERS)}")
        check_version(version)
        proj = await self.projects.get(project)
        now = time.time()
        abandoned: list[tuple[int, str | None]] = []
        build_id = await self.db.transaction(
            lambda tx: self._insert(tx, proj, None, ref, version, trigger, now, abandoned,
                                    builder=builder),
            lock=f"build:{project}")
        _RUNNING.add(self._key(build_id))
        status, error, artifact = "failed", "", None
        out = BuildLog(self.log_lines, Redactor())
        root = self._root(project, version, build_id)
        try:
            for old_id, owner in abandoned:
                await self._clear(old_id, project, version, owner)
            await self.db.execute(
                f"UPDATE {self.table} SET status = 'running', started = $1, beat = $1"
                " WHERE id = $2", time.time(), build_id)
            out.write(f"--- build {build_id}: {project} {version} ({ref}, {trigger})")
            result = await make(root, out)
            artifact = result.to_json()
            status = "succeeded"
            out.write(f"--- artifact: {result.kind} {result.path}")
        except BaseException as exc:
            error = f"{exc}" if isinstance(exc, CrawlhubError) else \
                f"internal error: {type(exc).__name__}: {exc}"
            out.write(f"--- failed: {error}")
            raise
        finally:
            await asyncio.shield(self._finish(build_id, status, error, "", artifact, out))
            if status != "succeeded" and root.exists():
                await asyncio.shield(asyncio.to_thread(shutil.rmtree, root, True))
            _RUNNING.discard(self._key(build_id))
            log.info("build %d of %s %s (%s) %s%s", build_id, project, version, trigger,
                     status, f": {error}" if error else "")
        return await self.get(build_id, with_log=False)

    # -- running -----------------------------------------------------------------------
    async def _run(self, build_id: int, proj: Project, ref: str, version: str,
                   watch: Callable[[str], None] | None) -> None:
        redactor = Redactor()
        out = BuildLog(self.log_lines, redactor, watch)
        status, error, commit, artifact = "failed", "", "", None
        flusher: asyncio.Task[None] | None = None
        root = self._root(proj.name, version, build_id)
        try:
            creds = await self.projects.credentials(proj.name)
            secret = await self.projects.webhook_secret(proj.name)
            password = creds.password.reveal() if creds.password else None
            out.redact = Redactor([s for s in (password, secret and secret.reveal()) if s],
                                  username=creds.username or "")
            flusher = asyncio.create_task(self._flush(build_id, out))
            async with self._slots:
                await self.db.execute(
                    f"UPDATE {self.table} SET status = 'running', started = $1, beat = $1"
                    " WHERE id = $2", time.time(), build_id)
                ctx = BuildContext(
                    project=proj.name, version=version, build=build_id, ref=ref, root=root,
                    options=dict(proj.builder.options), log=out,
                    deadline=time.monotonic() + self.timeout,
                    env={**scrubbed_environ(), "CRAWLHUB_PROJECT": proj.name,
                         "CRAWLHUB_VERSION": version, **build_marks(build_id, self.owner)})
                if root.exists():  # a fresh directory, always
                    await asyncio.to_thread(shutil.rmtree, root, True)
                ctx.say(f"build {build_id}: {proj.name} {version} from {ref} with the"
                        f" {proj.builder.name} builder")
                commit = await clone(ctx, proj.git_url, ref, username=creds.username,
                                     password=password)
                builder = make_builder(proj.builder.name, proj.builder.options)
                result = await builder.build(ctx)
                artifact = result.to_json()
                status = "succeeded"
                ctx.say(f"artifact: {result.kind} {result.path}")
        except (BuildFailed, CrawlhubError) as exc:  # a step failed; a secret key lost, ...
            error = out.redact(str(exc))
            out.write(f"--- failed: {error}")
        except asyncio.CancelledError:
            error = "interrupted: the server stopped during the build; build it again"
            out.write(f"--- {error}")
            raise
        except Exception as exc:  # a bug or an OS error: the build fails, the server lives
            error = out.redact(f"internal error: {type(exc).__name__}: {exc}")
            out.write(f"--- failed: {error}")
            log.warning("build %d of %s %s: %s", build_id, proj.name, version, error)
        finally:
            if flusher is not None:
                flusher.cancel()
                with contextlib.suppress(BaseException):
                    await flusher
            await asyncio.shield(self._finish(build_id, status, error, commit, artifact, out))
            if status != "succeeded" and root.exists():
                await asyncio.shield(asyncio.to_thread(shutil.rmtree, root, True))
            log.info("build %d of %s %s %s%s", build_id, proj.name, version, status,
                     f": {error}" if error else "")

    async def _flush(self, build_id: int, out: BuildLog) -> None:
        """Write the log while the build runs (so GET /builds/{id}/log shows it) and
        touch the row (so another process can tell it is alive)."""
        last_beat = 0.0
        while True:
            await asyncio.sleep(self.flush_every)
            now = time.time()
            if out.changed or now - last_beat >= min(10.0, self.stale_after / 4):
                out.changed = False
                with contextlib.suppress(Exception):
                    await self.db.execute(f"UPDATE {self.table} SET log = $1, beat = $2"
                                          " WHERE id = $3", out.text(), now, build_id)
                last_beat = now

    async def _finish(self, build_id: int, status: str, error: str, commit: str,
                      artifact: dict[str, Any] | None, out: BuildLog) -> None:
        await self.db.execute(
            f"UPDATE {self.table} SET status = $1, error = $2, commit_sha = $3,"
            " artifact = $4, log = $5, finished = $6, beat = $6 WHERE id = $7",
            status, error or None, commit or None,
            json.dumps(artifact) if artifact else None, out.text(), time.time(), build_id)

    # -- crashes -----------------------------------------------------------------------
    def _key(self, build_id: int) -> tuple[str, int]:
        return (f"{self.db.url}#{self.table}", int(build_id))

    def _abandoned(self, build_id: int, owner: str | None, beat: float | None,
                   now: float) -> bool:
        """Whether an active build's process is gone: a dead pid on this host (or this
        pid, when this process does not run the build: an earlier one had the pid), or
        no touch for ``stale_after`` seconds. A build this process runs never is, however
        late its touch (the database away a while): its steps are not to be killed."""
        if self._key(build_id) in _RUNNING:
            return False
        if beat is None or now - float(beat) > self.stale_after:
            return True
        pid = _local_pid(owner)
        if pid is None:
            return False
        return pid == os.getpid() or not pid_alive(pid)

    async def _interrupt(self, tx: Tx | ControlDB, build_id: int, owner: str | None,
                         now: float) -> None:
        await tx.execute(
            f"UPDATE {self.table} SET status = 'failed', error = $1, finished = $2"
            " WHERE id = $3 AND status IN ('queued', 'running')",
            f"interrupted: the process running it ({owner or 'unknown'}) stopped before it"
            " finished; build it again", now, build_id)
        log.warning("build %d was left unfinished by %s: marked failed", build_id, owner)

    async def _clear(self, build_id: int, project: str, version: str,
                     owner: str | None) -> None:
        """What an interrupted build of this host left: the processes its steps left
        running (they would run on unsupervised, writing into its directory) are killed,
        then its half-made directory is removed. A build of another host is only
        known to be silent: its directory, were it on a shared disk, is left to that host."""
        if owner is None or _local_pid(owner) is None:
            return
        stopped = await stop_leftovers(build_id, owner)
        if stopped:
            log.warning("build %d: its server %s is gone but its processes %s ran on;"
                        " killed them", build_id, owner, stopped)
        root = self._root(project, version, build_id)
        if root.exists():
            await asyncio.to_thread(shutil.rmtree, root, True)
            log.warning("build %d: removed its half-made directory %s", build_id, root)

    def _root(self, project: str, version: str, build_id: int) -> Path:
        return self.builds_dir / project / f"{version}-{build_id}"

    async def recover(self) -> int:
        """Mark failed every build whose process is gone, stop what it left running and
        remove its directory; how many."""
        rows = await self.db.fetch(
            f"SELECT id, project, version, owner, beat FROM {self.table}"
            " WHERE status IN ('queued', 'running')")
        now = time.time()
        done = 0
        for build_id, project, version, owner, beat in rows:
            if self._abandoned(int(build_id), owner, beat, now):
                await self._interrupt(self.db, int(build_id), owner, now)
                await self._clear(int(build_id), project, version, owner)
                done += 1
        return done

    # -- reading -----------------------------------------------------------------------
    async def get(self, build_id: int, *, with_log: bool = True) -> Build:
        cols = _COLUMNS + (", log" if with_log else "")
        row = await self.db.fetchone(f"SELECT {cols} FROM {self.table} WHERE id = $1",
                                     int(build_id))
        if row is None:
            raise NotFoundError(f"no build {build_id}")
        return _build(row, with_log)

    async def log_text(self, build_id: int) -> str:
        row = await self.db.fetchone(f"SELECT log FROM {self.table} WHERE id = $1",
                                     int(build_id))
        if row is None:
            raise NotFoundError(f"no build {build_id}")
        return str(row[0] or "")

    async def list(self, *, project: str | None = None, status: str | None = None,
                   limit: int = 50, before: int | None = None) -> list[Build]:
        """Builds newest first (without logs); ``before`` is a page cursor (an id)."""
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("project", project), ("status", status)):
            if value is not None:
                args.append(value)
                where.append(f"{column} = ${len(args)}")
        if before is not None:
            args.append(int(before))
            where.append(f"id < ${len(args)}")
        args.append(int(limit))
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = await self.db.fetch(f"SELECT {_COLUMNS} FROM {self.table}{clause}"
                                   f" ORDER BY id DESC LIMIT ${len(args)}", *args)
        return [_build(r, False) for r in rows]

    async def wait(self, build_id: int, timeout: float | None = None,
                   poll: float = 0.1) -> Build:
        """The build once it finished (a build of another process is polled)."""
        async with asyncio.timeout(timeout):
            task = self._tasks.get(int(build_id))
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)
            while True:
                build = await self.get(build_id)
                if build.done:
                    return build
                await asyncio.sleep(poll)

    async def artifact(self, project: str, version: str = LATEST) -> Artifact:
        """The artifact of ``project``'s newest successful build of ``version``
        (``latest``: of the highest version, :mod:`crawlhub.control.versions`);
        ``NotFoundError`` when there is none."""
        check_found(project)
        args: tuple[Any, ...]
        if version == LATEST:
            # by version, not by build: a replayed old release tag must not become latest
            ids = await self.db.fetch(f"SELECT id, version FROM {self.table}"
                                      " WHERE project = $1 AND status = 'succeeded'", project)
            best = highest((int(i), str(v)) for i, v in ids)
            where, args = "id = $1", (best if best is not None else 0,)
        else:
            where, args = "project = $1 AND version = $2", (project, version)
        row = await self.db.fetchone(
            f"SELECT id, version, commit_sha, artifact FROM {self.table}"
            f" WHERE {where} AND status = 'succeeded' ORDER BY id DESC LIMIT 1", *args)
        if row is None:
            await self.projects.get(project)  # no such project: say that instead
            which = "any version" if version == LATEST else f"version {version!r}"
            raise NotFoundError(f"project {project!r} has no successful build of {which};"
                                " push a release tag or start a build")
        build_id, found, commit, data = row
        artifact = Artifact.from_json(json.loads(data), project=project, version=found,
                                      build=int(build_id), commit=commit or "")
        if artifact.kind != "image" and not Path(artifact.path).exists():
            raise NotFoundError(f"the artifact of build {build_id} ({project} {found}) is no"
                                f" longer on disk at {artifact.path}; build it again")
        return artifact

    async def versions(self, project: str) -> builtins.list[str]:
        """The versions ``project`` has a successful build of, lowest first and
        ``latest`` last (:mod:`crawlhub.control.versions`'s order); [] for none."""
        check_found(project)
        rows = await self.db.fetch(f"SELECT id, version FROM {self.table}"
                                   " WHERE project = $1 AND status = 'succeeded'", project)
        newest: dict[str, int] = {}
        for build_id, version in rows:
            newest[str(version)] = max(int(build_id), newest.get(str(version), 0))
        return sorted(newest, key=lambda v: (*version_key(v), newest[v]))

    # -- removing ----------------------------------------------------------------------
    async def delete_project(self, name: str) -> None:
        """Remove a project, its build history and its build directories;
        ``ConflictError`` while one of its builds runs."""
        check_found(name)
        projects_table = self.projects.table

        abandoned: list[tuple[int, str, str | None]] = []

        async def steps(tx: Tx) -> int:
            now = time.time()
            rows = await tx.fetch(
                f"SELECT id, status, version, owner, beat FROM {self.table}"
                " WHERE project = $1 AND status IN ('queued', 'running')", name)
            for build_id, status, version, owner, beat in rows:
                if not self._abandoned(int(build_id), owner, beat, now):
                    raise ConflictError(f"build {build_id} of {name} is {status}; remove the"
                                        " project once it finished")
                abandoned.append((int(build_id), version, owner))
            await tx.execute(f"DELETE FROM {self.table} WHERE project = $1", name)
            return await tx.execute(f"DELETE FROM {projects_table} WHERE name = $1", name)

        if not await self.db.transaction(steps, lock=f"build:{name}"):
            raise NotFoundError(f"no project named {name!r}")
        for build_id, version, owner in abandoned:
            await self._clear(build_id, name, version, owner)
        await asyncio.to_thread(shutil.rmtree, self.builds_dir / name, True)

    async def delete_version(self, project: str, version: str, *,
                             keep: int | None = None) -> int:
        """Remove the finished builds of ``project``'s ``version`` (but build ``keep``)
        and their directories; how many. ``ConflictError`` while one of them runs (when
        nothing is kept), ``NotFoundError`` when there was none to remove and none kept."""
        check_found(project)

        async def steps(tx: Tx) -> list[int]:
            rows = await tx.fetch(
                f"SELECT id, status, owner, beat FROM {self.table}"
                " WHERE project = $1 AND version = $2", project, version)
            now = time.time()
            gone: list[int] = []
            for build_id, status, owner, beat in rows:
                if int(build_id) == keep:
                    continue
                if status in ("queued", "running") and \
                        not self._abandoned(int(build_id), owner, beat, now):
                    if keep is None:
                        raise ConflictError(f"build {build_id} of {project} {version} is"
                                            f" {status}; remove the version once it ended")
                    continue
                gone.append(int(build_id))
            for build_id in gone:
                await tx.execute(f"DELETE FROM {self.table} WHERE id = $1", build_id)
            return gone

        gone = await self.db.transaction(steps, lock=f"build:{project}")
        if not gone and keep is None:
            raise NotFoundError(f"project {project!r} has no build of version {version!r}")
        for build_id in gone:
            root = self._root(project, version, build_id)
            if root.exists():
                await asyncio.to_thread(shutil.rmtree, root, True)
        return len(gone)

    async def close(self) -> None:
        """Stop this process's builds (each is marked failed, interrupted)."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


def _build(row: tuple[Any, ...], with_log: bool) -> Build:
    (build_id, project, tag, ref, version, commit, status, builder, trigger, artifact,
     error, created, started, finished) = row[:14]
    data = json.loads(artifact) if artifact else {}
    return Build(id=int(build_id), project=project, tag=tag, ref=ref, version=version,
                 commit=commit, status=status, builder=builder, trigger=trigger,
                 artifact_kind=data.get("kind"), artifact_path=data.get("path"),
                 artifact_meta=dict(data.get("meta") or {}), error=error,
                 created=float(created), started=None if started is None else float(started),
                 finished=None if finished is None else float(finished),
                 log=(row[14] or "") if with_log else None)

"""Scrapyd's model on crawlhub's control plane: what each endpoint of Scrapyd's JSON API
does here (the HTTP face is :mod:`crawlhub.api.scrapyd`; docs/scrapyd.md maps them).

- a Scrapyd project is a crawlhub project; an egg uploaded for a version is a build of
  that version (builder ``egg``, trigger ``scrapyd``), the newest build of a version
  replacing the older ones as a new egg replaces the old under Scrapyd;
- a spider of a project is a crawlhub job ``scrapyd.<project>.<spider>`` running
  ``scrapy crawl <spider>`` in the build; a Scrapyd job is one run of it, started with the
  job's settings (``-s``) and arguments (``-a``), kept in the table ``scrapyd_jobs``
  (its jobid, its state and its run);
- ``pending`` jobs wait in that table for one of the ``max_proc`` slots (highest
  ``priority`` first, then oldest); a dispatcher starts them;
- a job's log is its run's lines in the log store; its items are the JSON lines file its
  feed writes (``items_dir``), as Scrapyd's.

Costs: every call is a few statements on the control database; the dispatcher reads the
running jobs' runs (at most ``max_proc``) once a second and when woken.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from crawlhub.control.builders import Artifact, BuildLog
from crawlhub.control.builds import BuildService, check_version
from crawlhub.control.db import ControlDB
from crawlhub.control.jobs import JobService
from crawlhub.control.jobs.model import LIVE, NAME_RE, JobSpec
from crawlhub.control.logs import LogService
from crawlhub.control.logs.text import LogQuery
from crawlhub.control.projects import NAME_RE as PROJECT_RE
from crawlhub.control.projects import NAME_RULE, InvalidProject
from crawlhub.control.scrapyd import eggs
from crawlhub.control.scrapyd.config import ScrapydSection
from crawlhub.control.scrapyd.eggs import ScrapydError
from crawlhub.core.errors import ConflictError, NotFoundError

log = logging.getLogger("crawlhub.control.scrapyd")

#: A jobid: it names a file (the job's items) and a URL path, so no '/' and no '..'.
JOBID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: A spider that can be scheduled: its name is in a job's name and in file paths.
SPIDER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: Seconds between two looks at the running jobs' runs (also woken by each change).
POLL_EVERY = 1.0
#: A job claimed for a start that never got its run (its server died in between) is
#: finished after this many seconds.
START_WAIT = 60.0
#: Lines of a job's log served at most by ``/logs/...`` (the log store pages 10,000).
MAX_LOG_LINES = 1_000_000
STATES = ("pending", "running", "finished")


@dataclass
class ScrapydJob:
    """One Scrapyd job: a spider run with settings and arguments, its jobid and state."""

    jobid: str
    project: str
    spider: str
    version: str | None
    settings: dict[str, str]
    args: dict[str, str]
    priority: float
    state: str
    created: float
    run_id: str | None = None
    started: float | None = None
    finished: float | None = None
    pid: int | None = None
    error: str | None = None


def scrapyd_time(ts: float | None) -> str | None:
    """A time as Scrapyd prints it: ``str(datetime)`` in local time
    (``2026-11-28 03:20:07.123456``)."""
    return None if ts is None else str(datetime.fromtimestamp(ts))


def job_name(project: str, spider: str) -> str:
    """The crawlhub job that runs ``spider`` of ``project``: ``scrapyd.<project>.<spider>``,
    or ``scrapyd.<project>.<hash>`` when that is over a job name's 64 characters."""
    name = f"scrapyd.{project}.{spider}"
    if NAME_RE.match(name):
        return name
    digest = hashlib.sha1(f"{project}/{spider}".encode()).hexdigest()[:12]
    return f"scrapyd.{project[:40]}.{digest}"


_COLUMNS = ("jobid, project, spider, version, settings, args, priority, state, created,"
            " run_id, started, finished, pid, error")


class ScrapydService:
    """Scrapyd's endpoints over the builds, jobs and logs of a control plane; see the
    module docstring. :meth:`open` makes its table and starts the dispatcher."""

    def __init__(self, db: ControlDB, builds: BuildService, jobs: JobService,
                 logs: LogService, section: ScrapydSection) -> None:
        self.db = db
        self.builds = builds
        self.projects = builds.projects
        self.jobs = jobs
        self.logs = logs
        self.section = section
        self.table = db.table("scrapyd_jobs")
        #: "node_name" of every answer
        self.node_name = section.node_name or socket.gethostname()
        self.slots = section.slots(os.cpu_count())
        self.items_dir = Path(section.items_dir).absolute() if section.items_dir else None
        #: spiders by build id (a build's spiders never change)
        self._spiders: dict[int, list[str]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, db: ControlDB, builds: BuildService, jobs: JobService,
                   logs: LogService, section: ScrapydSection) -> ScrapydService:
        service = cls(db, builds, jobs, logs, section)
        t = service.table
        await db.schema([
            f"CREATE TABLE IF NOT EXISTS {t} (jobid TEXT PRIMARY KEY, project TEXT NOT NULL,"
            " spider TEXT NOT NULL, version TEXT, settings TEXT NOT NULL, args TEXT NOT NULL,"
            " priority DOUBLE PRECISION NOT NULL, state TEXT NOT NULL,"
            " created DOUBLE PRECISION NOT NULL, run_id TEXT, started DOUBLE PRECISION,"
            " finished DOUBLE PRECISION, pid BIGINT, error TEXT)",
            f"CREATE INDEX IF NOT EXISTS {t}_state ON {t} (state, priority, created)",
            f"CREATE INDEX IF NOT EXISTS {t}_project ON {t} (project, state)",
        ])
        return service

    def start(self) -> None:
        """Start the dispatcher: pending jobs start in this process as slots free up."""
        if self._task is None:
            self._task = asyncio.create_task(self._dispatch(),
                                             name="crawlhub scrapyd dispatcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # -- projects and versions ------------------------------------------------------------
    async def list_projects(self) -> list[str]:
        names: list[str] = []
        after: str | None = None
        while True:
            page = await self.projects.list(limit=1000, after=after)
            names += [p.name for p in page]
            if len(page) < 1000:
                return names
            after = page[-1].name

    async def list_versions(self, project: str) -> list[str]:
        """Scrapyd answers an unknown project with no versions, not an error."""
        if not PROJECT_RE.match(project):
            return []
        return await self.builds.versions(project)

    async def add_version(self, project: str, version: str, egg: bytes) -> int:
        """Take an egg as ``version`` of ``project`` (made when new); the number of its
        spiders. A bad egg, or one whose ``scrapy list`` fails, changes nothing."""
        settings = eggs.settings_module(egg)
        if not PROJECT_RE.match(project):
            raise ScrapydError(f"project {project[:80]!r} is not a valid name: use"
                               f" {NAME_RULE}")
        try:
            check_version(version)
        except InvalidProject as exc:
            raise ScrapydError(str(exc)) from None
        made = False
        try:
            await self.projects.get(project)
        except NotFoundError:
            with contextlib.suppress(ConflictError):  # made at the same time elsewhere
                await self.projects.create_uploaded(project)
                made = True
        spiders: list[str] = []

        async def make(root: Path, out: BuildLog) -> Artifact:
            artifact = await asyncio.to_thread(eggs.lay_out, root, egg, project=project,
                                               version=version, settings=settings)
            out.write(f"--- egg of {len(egg)} bytes, settings {settings}; scrapy list")
            spiders.extend(await eggs.list_spiders(artifact,
                                                   timeout=float(self.section.list_timeout)))
            out.write(f"--- spiders: {', '.join(spiders) or '(none)'}")
            return artifact

        try:
            build = await self.builds.record(project, version, make, trigger="scrapyd",
                                             builder="egg", ref=f"egg:{version}")
        except BaseException:
            if made:  # the project came with this egg: it goes with it
                with contextlib.suppress(Exception):
                    await self.builds.delete_project(project)
            raise
        self._spiders[build.id] = list(spiders)
        # the new egg replaces the older builds of this version
        await self.builds.delete_version(project, version, keep=build.id)
        log.info("scrapyd: %s %s uploaded (build %d, %d spiders)", project, version,
                 build.id, len(spiders))
        return len(spiders)

    async def delete_version(self, project: str, version: str) -> None:
        await self._project(project)
        if version not in await self.builds.versions(project):
            raise ScrapydError(f"version {version[:80]!r} not found")
        await self.builds.delete_version(project, version)

    async def delete_project(self, project: str) -> None:
        """The project and its builds; its pending jobs are dropped (its running ones
        and its jobs' run history stay, as under Scrapyd)."""
        await self._project(project)
        await self.builds.delete_project(project)
        await self.db.execute(f"DELETE FROM {self.table} WHERE project = $1 AND"
                              " state = 'pending'", project)

    async def list_spiders(self, project: str, version: str | None = None) -> list[str]:
        """The spiders of ``project``'s ``version`` (default: its latest), as its
        ``scrapy list`` says; read once per build."""
        artifact = await self._artifact(project, version)
        known = self._spiders.get(artifact.build)
        if known is None:
            known = await eggs.list_spiders(artifact, timeout=float(self.section.list_timeout))
            self._spiders[artifact.build] = known
        return list(known)

    async def _project(self, project: str) -> None:
        if not PROJECT_RE.match(project):
            raise ScrapydError(f"project {project[:80]!r} not found")
        try:
            await self.projects.get(project)
        except NotFoundError:
            raise ScrapydError(f"project {project!r} not found") from None

    async def _artifact(self, project: str, version: str | None) -> Artifact:
        await self._project(project)
        if version and not _version_ok(version):
            raise ScrapydError(f"version {version[:80]!r} not found")
        try:
            return await self.builds.artifact(project, version or "latest")
        except NotFoundError:
            if version:
                raise ScrapydError(f"version {version!r} not found") from None
            raise ScrapydError(f"project {project!r} has no version yet: deploy one with"
                               " scrapyd-deploy (addversion.json)") from None

    # -- jobs -----------------------------------------------------------------------------
    async def schedule(self, project: str, spider: str, *, version: str | None = None,
                       jobid: str | None = None, priority: float = 0.0,
                       settings: dict[str, str] | None = None,
                       args: dict[str, str] | None = None) -> str:
        """Queue a run of ``spider``; its jobid (``jobid`` or a new uuid1 hex, as
        Scrapyd's). It starts when a slot is free."""
        if not await self._has_spider(project, spider, version):
            raise ScrapydError(f"spider {spider[:80]!r} not found")
        if not SPIDER_RE.match(spider):
            raise ScrapydError(f"spider {spider[:80]!r} cannot be scheduled here: its name"
                               " must be letters, digits, '.', '_' or '-'")
        jobid = jobid if jobid is not None else uuid.uuid1().hex
        if not JOBID_RE.match(jobid):
            raise ScrapydError(f"jobid {jobid[:80]!r} is not valid: 1 to 128 letters,"
                               " digits, '.', '_' or '-', starting with a letter or digit")
        for key in settings or {}:
            if not key or "=" in key:
                raise ScrapydError(f"setting {key[:80]!r} is not NAME=VALUE")
        await self._ensure_job(project, spider)
        rows = await self.db.fetch(
            f"INSERT INTO {self.table} (jobid, project, spider, version, settings, args,"
            " priority, state, created) VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8)"
            " ON CONFLICT (jobid) DO NOTHING RETURNING jobid",
            jobid, project, spider, version, json.dumps(settings or {}),
            json.dumps(args or {}), float(priority), time.time())
        if not rows:
            raise ScrapydError(f"jobid {jobid!r} is taken: choose another, or leave it out"
                               " for a new one")
        self._wake.set()
        log.info("scrapyd: job %s scheduled: %s %s", jobid, project, spider)
        return jobid

    async def _has_spider(self, project: str, spider: str, version: str | None) -> bool:
        return spider in await self.list_spiders(project, version)

    async def _ensure_job(self, project: str, spider: str) -> str:
        """The crawlhub job of ``spider``, made on first use."""
        name = job_name(project, spider)
        command = ["scrapy", "crawl", spider]
        found = await self.jobs.store.find(name)
        if found is None:
            spec = JobSpec(name=name, kind="subprocess", project=project, command=command,
                           max_instances=1000,
                           notes=f"spider {spider} of project {project}: Scrapyd's"
                           " schedule.json runs it; each run is a Scrapyd job"
                           " (docs/scrapyd.md)")
            with contextlib.suppress(ConflictError):  # made at the same time elsewhere
                await self.jobs.create(spec)
            return name
        if found.project != project or found.command != command:
            raise ScrapydError(f"job {name!r} exists but does not run spider {spider!r} of"
                               f" project {project!r}: rename or remove that job")
        return name

    async def cancel(self, project: str, jobid: str) -> str | None:
        """Scrapyd's ``prevstate``: ``pending`` (dropped from the queue), ``running``
        (asked to stop: the exit request, SIGTERM, SIGKILL after the grace period), or
        None (finished or unknown)."""
        await self._project(project)
        job = await self.get(jobid)
        if job is None or job.project != project:
            return None
        if job.state == "pending":
            dropped = await self.db.execute(
                f"DELETE FROM {self.table} WHERE jobid = $1 AND state = 'pending'", jobid)
            if dropped:
                return "pending"
            job = await self.get(jobid)  # started meanwhile
            if job is None:
                return None
        if job.state == "running":
            if job.run_id is not None:
                with contextlib.suppress(ConflictError, NotFoundError):  # over meanwhile
                    await self.jobs.cancel_run(job.run_id)
            self._wake.set()
            return "running"
        return None

    async def get(self, jobid: str) -> ScrapydJob | None:
        row = await self.db.fetchone(f"SELECT {_COLUMNS} FROM {self.table} WHERE jobid = $1",
                                     jobid)
        return None if row is None else _job(row)

    async def status(self, jobid: str, project: str | None = None) -> str | None:
        if project is not None:
            await self._project(project)
        await self._sync()
        job = await self.get(jobid)
        if job is None or (project is not None and job.project != project):
            return None
        return job.state

    async def list_jobs(self, project: str | None = None) -> dict[str, list[ScrapydJob]]:
        """Pending (next first), running (oldest first) and the newest
        ``finished_to_keep`` finished jobs (newest first), of one project or all."""
        if project is not None:
            await self._project(project)
        await self._sync()
        where, args = ("", []) if project is None else (" AND project = $1", [project])
        out: dict[str, list[ScrapydJob]] = {}
        for state, order in (("pending", "priority DESC, created"),
                             ("running", "started, created"),
                             ("finished", "finished DESC")):
            limit = f" LIMIT {int(self.section.finished_to_keep)}" if state == "finished" else ""
            rows = await self.db.fetch(
                f"SELECT {_COLUMNS} FROM {self.table} WHERE state = '{state}'{where}"
                f" ORDER BY {order}{limit}", *args)
            out[state] = [_job(row) for row in rows]
        return out

    async def counts(self) -> dict[str, int]:
        await self._sync()
        rows = await self.db.fetch(f"SELECT state, COUNT(*) FROM {self.table} GROUP BY state")
        got = {str(state): int(n) for state, n in rows}
        return {state: got.get(state, 0) for state in STATES}

    # -- logs and items -------------------------------------------------------------------
    async def job_of(self, project: str, spider: str, jobid: str) -> ScrapydJob:
        """The job at ``/logs|items/<project>/<spider>/<jobid>``; NotFoundError if none."""
        job = await self.get(jobid)
        if job is None or job.project != project or job.spider != spider:
            raise NotFoundError(f"no Scrapyd job {jobid[:80]!r} of spider {spider[:80]!r}"
                                f" in project {project[:80]!r}")
        return job

    async def log_text(self, job: ScrapydJob) -> AsyncIterator[str]:
        """The job's log: its run's lines from the log store, oldest first, a line each."""
        if job.run_id is None:
            if job.error:
                yield job.error + "\n"
            return
        after = 0
        served = 0
        while served < MAX_LOG_LINES:
            page = await self.logs.search(LogQuery(run=job.run_id, after=after, limit=10_000))
            for line in page.lines:
                yield line.message + "\n"
            served += len(page.lines)
            if page.next is None or not page.lines:
                return
            after = page.next

    def items_path(self, job: ScrapydJob) -> Path | None:
        """Where the job's feed writes its items (JSON lines); None without
        ``items_dir``."""
        if self.items_dir is None:
            return None
        return self.items_dir / job.project / job.spider / f"{job.jobid}.jl"

    # -- the dispatcher -------------------------------------------------------------------
    async def _dispatch(self) -> None:
        while True:
            try:
                await self._sync()
                await self._launch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away a while: try again
                log.warning("scrapyd: the dispatcher failed: %s", exc)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_EVERY):
                    await self._wake.wait()

    async def _sync(self) -> None:
        """Running jobs whose run ended are finished (with the run's end time); a live
        run's process id is noted (the run has it once its process started)."""
        rows = await self.db.fetch(
            f"SELECT jobid, run_id, started, pid FROM {self.table} WHERE state = 'running'")
        ended = 0
        now = time.time()
        for jobid, run_id, started, pid in rows:
            if run_id is None:
                if started is not None and now - float(started) > START_WAIT:
                    ended += await self._finish(jobid, now, "its start was interrupted")
                continue
            try:
                run = await self.jobs.store.run(run_id)
            except NotFoundError:
                ended += await self._finish(jobid, now, f"its run {run_id} is gone")
                continue
            if run.status not in LIVE:
                ended += await self._finish(jobid, run.finished_at or now, None)
            elif run.pid is not None and run.pid != pid:
                await self.db.execute(f"UPDATE {self.table} SET pid = $1 WHERE jobid = $2",
                                      run.pid, jobid)
        if ended:
            await self._prune()
            self._wake.set()

    async def _finish(self, jobid: str, when: float, error: str | None) -> int:
        return await self.db.execute(
            f"UPDATE {self.table} SET state = 'finished', finished = $1,"
            " error = COALESCE($2, error) WHERE jobid = $3 AND state = 'running'",
            when, error, jobid)

    async def _prune(self) -> None:
        """Keep the newest ``finished_to_keep`` finished jobs (Scrapyd's rule)."""
        keep = int(self.section.finished_to_keep)
        await self.db.execute(
            f"DELETE FROM {self.table} WHERE state = 'finished' AND jobid NOT IN"
            f" (SELECT jobid FROM {self.table} WHERE state = 'finished'"
            f" ORDER BY finished DESC LIMIT {keep})")

    async def _launch(self) -> None:
        """Start pending jobs while slots are free, highest priority first."""
        row = await self.db.fetchone(
            f"SELECT COUNT(*) FROM {self.table} WHERE state = 'running'")
        free = self.slots - int(row[0] if row else 0)
        if free <= 0:
            return
        rows = await self.db.fetch(
            f"SELECT {_COLUMNS} FROM {self.table} WHERE state = 'pending'"
            f" ORDER BY priority DESC, created LIMIT {int(free)}")
        for row in rows:
            job = _job(row)
            now = time.time()
            # claimed by one dispatcher only, should several servers share the table
            claimed = await self.db.execute(
                f"UPDATE {self.table} SET state = 'running', started = $1"
                " WHERE jobid = $2 AND state = 'pending'", now, job.jobid)
            if claimed:
                await self._start(job, now)

    async def _start(self, job: ScrapydJob, now: float) -> None:
        settings = dict(job.settings)
        items = self.items_path(job)
        if items is not None:  # as Scrapyd's items_dir: its feed overrides the job's
            await asyncio.to_thread(_prepare_items, items, self.section.jobs_to_keep)
            settings["FEEDS"] = json.dumps({items.as_uri(): {"format": "jsonlines"}})
        argv: list[str] = []
        for key, value in settings.items():
            argv += ["-s", f"{key}={value}"]
        # Scrapyd passes the jobid (and a pinned version) as spider arguments too
        spider_args = {**job.args, "_job": job.jobid}
        if job.version:
            spider_args["_version"] = job.version
        for key, value in spider_args.items():
            argv += ["-a", f"{key}={value}"]
        try:
            name = await self._ensure_job(job.project, job.spider)
            run = await self.jobs.run(name, trigger="scrapyd", args=argv,
                                      env={"SCRAPY_JOB": job.jobid}, version=job.version)
        except Exception as exc:  # no build any more, a refused env, ...: it ends here
            log.warning("scrapyd: job %s of %s %s could not start: %s", job.jobid,
                        job.project, job.spider, exc)
            await self.db.execute(
                f"UPDATE {self.table} SET state = 'finished', finished = $1, error = $2"
                " WHERE jobid = $3", time.time(), f"not started: {exc}", job.jobid)
            return
        await self.db.execute(
            f"UPDATE {self.table} SET run_id = $1, started = $2 WHERE jobid = $3",
            run.id, run.started_at, job.jobid)
        log.info("scrapyd: job %s started as run %s of %s", job.jobid, run.id, name)


def _version_ok(version: str) -> bool:
    try:
        check_version(version)
    except InvalidProject:
        return False
    return True


def _prepare_items(path: Path, keep: int) -> None:
    """Make the spider's items directory; drop its oldest files beyond ``keep`` (as
    Scrapyd's ``jobs_to_keep``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files = sorted((p for p in path.parent.iterdir() if p.is_file()),
                   key=lambda p: p.stat().st_mtime)
    for old in files[:max(0, len(files) - keep + 1)]:
        with contextlib.suppress(OSError):
            old.unlink()


def _job(row: tuple[Any, ...]) -> ScrapydJob:
    (jobid, project, spider, version, settings, args, priority, state, created, run_id,
     started, finished, pid, error) = row
    return ScrapydJob(jobid=jobid, project=project, spider=spider, version=version,
                      settings=json.loads(settings), args=json.loads(args),
                      priority=float(priority), state=state, created=float(created),
                      run_id=run_id, started=None if started is None else float(started),
                      finished=None if finished is None else float(finished),
                      pid=None if pid is None else int(pid), error=error)

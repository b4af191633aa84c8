"""``/jobs/``: one API for every kind of job (subprocess, crawl, collect).

Create (``POST /jobs/ {name, command: [argv...], cron?, ...}``), change, remove, run now,
pause, continue, cancel, restart; queue figures and runs of a job. The config's
collection jobs are listed as kind ``collect``; their older endpoints (``/start``,
``/stop``, ``/log`` and the status body of ``GET /jobs/{name}``) answer as before.

Errors are the app's one mapping: unknown job 404, a clash with the job's state (at
``max_instances``, disabled, defined in the config) 409, a database away 503. An ``env``
that sets a loader or startup-hook variable (``LD_*``, ``PYTHONSTARTUP``, ...) not in
``control.allowed_env`` is 422 on create, change, run and restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Depends, Query
from pydantic import BaseModel, Field, ValidationError

from crawlhub.api import routing
from crawlhub.api.deps import ApiError, control_plane, services
from crawlhub.api.openapi import BACKEND, BODY, errors
from crawlhub.collect.service import CollectJobManager
from crawlhub.control.jobs import JobPatch, JobService, JobSpec, JobView, QueueInfo, RunRecord
from crawlhub.control.jobs.model import JobEnvError
from crawlhub.core.configtypes import new_list
from crawlhub.core.errors import NotFoundError
from crawlhub.services import Services

router = routing.router(prefix="/jobs", tags=["jobs"])


def job_service(svc: Services = Depends(services)) -> JobService:
    """The control plane's jobs (503 on services built without a control plane)."""
    return control_plane(svc).jobs


def collect_jobs(svc: Services = Depends(services)) -> CollectJobManager | None:
    return svc.jobs


@contextmanager
def _env_checked() -> Iterator[None]:
    """A job env the server refuses is the client's to fix: 422, naming the variable."""
    try:
        yield
    except JobEnvError as exc:
        raise ApiError(422, str(exc)) from None


class JobRow(BaseModel):
    """A job in ``GET /jobs/``: its spec's main fields and what it is doing."""

    name: str
    kind: str
    source: str = Field(description="api: made through the API/CLI; config: the config's"
                        " collection jobs")
    enabled: bool
    cron: str | None
    next_fire: float | None = Field(description="epoch seconds of the next cron tick")
    project: str | None
    version: str | None
    command: list[str]
    max_instances: int
    state: str = Field(description="running, pausing (pause asked, not yet in effect in"
                       " every run), paused or idle")
    desired: str = Field(description="the control channel's desired state: run, pause, exit")
    pausable: bool = Field(True, description="false: the job opted out of pause (pausable:"
                           " false); POST /jobs/{name}/pause answers 409")
    running: list[str] = Field(description="ids of the runs going now")
    paused: list[str] = Field(default_factory=new_list, description="those of them whose pause"
                              " took effect (acknowledged by the job, or its processes"
                              " stopped)")
    last_run: RunRecord | None
    notes: str
    # Fields of the collection jobs' older listing (None for other kinds).
    auto_start: bool | None = None
    strategy: str | None = None
    run_id: str | None = None
    runner: dict[str, Any] | None = None
    last_status: str | None = None


class RunStarted(BaseModel):
    name: str
    run_id: str
    state: str = "running"
    run: RunRecord | None = None


class Cancelled(BaseModel):
    name: str
    runs: list[str] = Field(description="the runs asked to stop")


def row(view: JobView) -> JobRow:
    spec = view.spec
    state = "running" if view.running else "idle"
    if view.desired == "pause" and spec.pausable:
        # paused once every run holds still (the truth, not the wish); collect runs of
        # the config's jobs have no run row ("(collect)"): their pause is in process
        held = set(view.paused) | {r for r in view.running if r.startswith("(")}
        state = "paused" if held >= set(view.running) else "pausing"
    return JobRow(name=spec.name, kind=spec.kind, source=view.source, enabled=spec.enabled,
                  cron=spec.cron, next_fire=view.next_fire, project=spec.project,
                  version=spec.version, command=spec.argv(), max_instances=spec.max_instances,
                  state=state, desired=view.desired, pausable=spec.pausable,
                  running=view.running, paused=view.paused, last_run=view.last_run,
                  notes=spec.notes)


def optional_job_service(svc: Services = Depends(services)) -> JobService | None:
    """The control plane's jobs, or None: the collection jobs' older routes answer
    without a control plane."""
    return None if svc.control is None else svc.control.jobs


@router.get("/", responses=errors(*BACKEND))
async def list_jobs(jobs: JobService | None = Depends(optional_job_service),
                    collect: CollectJobManager | None = Depends(collect_jobs),
                    after: str | None = Query(None, description="the last name of the page"
                                              " before (keyset paging)"),
                    limit: int = Query(100, ge=1, le=1000),
                    kind: str | None = Query(None, pattern="^(subprocess|crawl|collect)$"),
                    prefix: str | None = Query(None, max_length=64)) -> list[JobRow]:
    """Jobs by name, 100 a page: ``?after=<last name>`` for the next page."""
    if jobs is None:  # a server without its control plane: the collection jobs alone
        return [JobRow(name=item["name"], kind="collect", source="config",
                       enabled=item["enabled"], cron=None, next_fire=None, project=None,
                       version=None, command=[], max_instances=1, state=item["state"],
                       desired="run", pausable=True, running=[item["run_id"]] if item["run_id"] else [],
                       last_run=None, notes="", auto_start=item["auto_start"],
                       strategy=item["strategy"], run_id=item["run_id"],
                       runner=item["runner"], last_status=item["last_status"])
                for item in (await collect.list() if collect is not None else [])
                if after is None or item["name"] > after][:limit]
    rows = [row(view) for view in await jobs.list_jobs(after=after, limit=limit, kind=kind,
                                                        prefix=prefix)]
    if collect is not None:
        legacy = {item["name"]: item for item in await collect.list()}
        for item in rows:
            old = legacy.get(item.name)
            if old is not None and item.source == "config":
                item.auto_start, item.strategy = old["auto_start"], old["strategy"]
                item.run_id, item.runner = old["run_id"], old["runner"]
                item.last_status = old["last_status"]
                if old["state"] == "running":
                    item.state = "running"
    return rows


@router.post("/", status_code=201, responses=errors(*BODY, 409, *BACKEND))
async def create_job(spec: JobSpec, jobs: JobService = Depends(job_service)) -> JobRow:
    """Create a job: ``{"name": "news", "command": ["python", "news.py"], "cron": "*/10 *
    * * *"}``; 409 when the name is taken."""
    with _env_checked():
        return row(await jobs.create(spec))


@router.get("/{name}", responses=errors(404, *BACKEND))
async def get_job(name: str, jobs: JobService | None = Depends(optional_job_service),
                  collect: CollectJobManager | None = Depends(collect_jobs),
                  log_lines: int = Query(200, ge=0, le=5000)) -> dict[str, Any]:
    """The job (``spec`` and state). A collection job's answer also holds its older
    status fields: live progress, saved progress, last result and log lines."""
    if jobs is None:
        return await _manager(collect).status(name, log_lines=log_lines)
    view = await jobs.get(name)
    body: dict[str, Any] = row(view).model_dump()
    body["spec"] = view.spec.model_dump()
    body["queue"] = (await jobs.queue(name)).model_dump()
    if view.source == "config" and collect is not None:
        status = await collect.status(name, log_lines=log_lines)
        body.update(status)
    return body


@router.patch("/{name}", responses=errors(*BODY, 404, 409, *BACKEND))
async def update_job(name: str, patch: JobPatch,
                     jobs: JobService = Depends(job_service)) -> JobRow:
    """Change some fields of a job (not its name or kind); 422 when the changed job
    would not be valid (the body names the field)."""
    try:
        with _env_checked():
            return row(await jobs.update(name, patch))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ApiError(422, f"invalid request: body.{where}: {first.get('msg')}") from None


@router.delete("/{name}", status_code=204, responses=errors(404, 409, *BACKEND))
async def delete_job(name: str, jobs: JobService = Depends(job_service)) -> None:
    """Remove a job (its runs are cancelled first; their history stays)."""
    await jobs.delete(name)


@router.post("/{name}/run", status_code=202, responses=errors(404, 409, 422, *BACKEND))
async def run_job(name: str, jobs: JobService = Depends(job_service)) -> RunStarted:
    """Start a run now; 409 at ``max_instances`` (the answer names the runs going)."""
    with _env_checked():
        run = await jobs.run(name)
    return RunStarted(name=name, run_id=run.id, run=run)


@router.post("/{name}/pause", responses=errors(404, 409, *BACKEND))
async def pause_job(name: str, jobs: JobService = Depends(job_service)) -> JobRow:
    """Pause: runs hold still within a second, losing nothing (a job that does not
    acknowledge the pause has its processes stopped, SIGSTOP); later runs start paused
    until ``/continue`` (the desired state is stored). ``state`` is ``pausing`` until
    every run holds still. 409 for a job with ``pausable: false``."""
    return row(await jobs.pause(name))


@router.post("/{name}/continue", responses=errors(404, *BACKEND))
async def continue_job(name: str, jobs: JobService = Depends(job_service)) -> JobRow:
    """Continue a paused job."""
    return row(await jobs.resume(name))


@router.post("/{name}/cancel", responses=errors(404, *BACKEND))
async def cancel_job(name: str, jobs: JobService = Depends(job_service),
                     wait: float = Query(0, ge=0, le=300, description="seconds to wait for"
                                         " the runs to end")) -> Cancelled:
    """Cancel the job's runs on every host: SIGTERM, then SIGKILL after
    ``control.grace`` seconds."""
    return Cancelled(name=name, runs=await jobs.cancel(name, wait=wait or None))


@router.post("/{name}/restart", status_code=202, responses=errors(404, 409, 422, *BACKEND))
async def restart_job(name: str, jobs: JobService = Depends(job_service)) -> RunStarted:
    """Cancel the job's runs, wait for them to end, start a new run."""
    with _env_checked():
        run = await jobs.restart(name)
    return RunStarted(name=name, run_id=run.id, run=run)


@router.get("/{name}/queue", responses=errors(404, *BACKEND))
async def job_queue(name: str, jobs: JobService = Depends(job_service)) -> QueueInfo:
    """Left, Total, Success, Failed, Retried and rate of the job's newest run."""
    return await jobs.queue(name)


@router.get("/{name}/runs", responses=errors(404, *BACKEND))
async def job_runs(name: str, jobs: JobService = Depends(job_service),
                   before: str | None = None, limit: int = Query(50, ge=1, le=1000),
                   ) -> list[RunRecord]:
    """The job's runs, newest first (``?before=<run id>`` pages)."""
    await jobs.spec(name)
    return await jobs.runs(job=name, before=before, limit=limit)


# -- the collection jobs' older endpoints ---------------------------------------------------
def _manager(collect: CollectJobManager | None) -> CollectJobManager:
    if collect is None:
        raise NotFoundError("no collection jobs are configured (the config has no 'jobs:')")
    return collect


@router.get("/{name}/log", responses=errors(404, *BACKEND))
async def job_log_lines(name: str, collect: CollectJobManager | None = Depends(collect_jobs),
                        lines: int = Query(200, ge=0, le=5000)) -> dict[str, Any]:
    """A collection job's newest log lines, whichever process ran it (other jobs: ``GET
    /logs?job=``)."""
    got = await _manager(collect).log(name, lines)
    return {"name": name, "lines": got}


@router.post("/{name}/start", status_code=202, responses=errors(404, 409, *BACKEND))
async def start_job(name: str, collect: CollectJobManager | None = Depends(collect_jobs)
                    ) -> dict[str, Any]:
    """Start a collection job in the background; 409 when disabled or already running
    (here or in another process: the answer names its pid, host and start time)."""
    run_id = await _manager(collect).start(name)
    return {"name": name, "run_id": run_id, "state": "running"}


@router.post("/{name}/stop", responses=errors(404, *BACKEND))
async def stop_job(name: str, collect: CollectJobManager | None = Depends(collect_jobs),
                   wait: bool = True) -> dict[str, Any]:
    """Cancel a running collection job; everything processed is written and progress
    saved. A run in another process is asked through its lease and stops at its next
    heartbeat (the answer's state is then still ``running``)."""
    manager = _manager(collect)
    stopped = await manager.stop(name, wait=wait)
    status = await manager.status(name, log_lines=0)
    return {"name": name, "stopped": stopped, "state": status["state"],
            "last_result": status["last_result"]}

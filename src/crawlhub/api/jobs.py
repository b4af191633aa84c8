"""Collection jobs over HTTP: list, status, start, stop (a thin shell over JobManager).

Unknown job -> 404; a job that is disabled or already running (in any process: runs
hold a lease in the metadata store) cannot start -> 409.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

from crawlhub.api.openapi import errors
from crawlhub.collect.service import JobConflict, JobManager, JobNotFound

router = APIRouter(prefix="/jobs", tags=["jobs"])


def _manager(request: Request) -> JobManager:
    services = getattr(request.app.state, "services", None)
    jobs = getattr(services, "jobs", None)
    if jobs is None:
        raise HTTPException(404, "no collection jobs are configured (the config has no 'jobs:')")
    return jobs  # type: ignore[no-any-return]


def _http(exc: Exception) -> HTTPException:
    if isinstance(exc, JobNotFound):
        return HTTPException(404, str(exc))
    return HTTPException(409, str(exc))


@router.get("/", responses=errors(404, 503))
async def list_jobs(request: Request) -> list[dict[str, Any]]:
    """Every configured job: name, enabled, auto_start, strategy, state, last status."""
    return await _manager(request).list()


@router.get("/{name}", responses=errors(404, 503))
async def job_status(request: Request, name: str, log_lines: int = 200) -> dict[str, Any]:
    """State, live progress, saved progress, the last RunResult and the job's log lines."""
    try:
        return await _manager(request).status(name, log_lines=max(0, min(log_lines, 5000)))
    except JobNotFound as exc:
        raise _http(exc) from None


@router.get("/{name}/log", responses=errors(404, 503))
async def job_log_lines(request: Request, name: str, lines: int = 200) -> dict[str, Any]:
    """The job's newest log lines, whichever process ran it (server or CLI)."""
    try:
        got = await _manager(request).log(name, max(0, min(lines, 5000)))
    except JobNotFound as exc:
        raise _http(exc) from None
    return {"name": name, "lines": got}


@router.post("/{name}/start", status_code=202, responses=errors(404, 409, 503))
async def start_job(request: Request, name: str) -> dict[str, Any]:
    """Start a run in the background; 409 when disabled or already running (in this
    process or another: the answer names its pid, host and start time)."""
    try:
        run_id = await _manager(request).start(name)
    except (JobNotFound, JobConflict) as exc:
        raise _http(exc) from None
    return {"name": name, "run_id": run_id, "state": "running"}


@router.post("/{name}/stop", responses=errors(404, 503))
async def stop_job(request: Request, name: str, wait: bool = True) -> dict[str, Any]:
    """Cancel the running job; everything processed is written and progress saved.

    A run in another process (``crawlhub collect``, another server) is asked to stop
    through its lease and stops at its next heartbeat; the answer's state is then still
    ``running``."""
    manager = _manager(request)
    try:
        stopped = await manager.stop(name, wait=wait)
        status = await manager.status(name, log_lines=0)
    except JobNotFound as exc:
        raise _http(exc) from None
    return {
        "name": name,
        "stopped": stopped,
        "state": status["state"],
        "last_result": status["last_result"],
    }

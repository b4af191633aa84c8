"""``/runs/``: the run history of every job, newest first, with each run's task timeline
and queue figures."""

from __future__ import annotations

import re

from fastapi import Depends, Query

from crawlhub.api import routing
from crawlhub.api.deps import ApiError
from crawlhub.api.jobs import job_service
from crawlhub.api.openapi import BACKEND, errors
from crawlhub.control.jobs import JobService, RunRecord, RunView, TaskRecord
from crawlhub.control.jobs.model import FINAL, LIVE

router = routing.router(prefix="/runs", tags=["runs"])

_STATUS = "^(" + "|".join((*LIVE, *FINAL)) + ")$"


@router.get("/", responses=errors(*BACKEND))
async def list_runs(jobs: JobService = Depends(job_service),
                    job: str | None = Query(None, max_length=100),
                    status: list[str] = Query([], description="one or more statuses"),
                    before: str | None = Query(None, max_length=64,
                                               description="the last run id of the page"
                                               " before (keyset paging)"),
                    limit: int = Query(50, ge=1, le=1000)) -> list[RunRecord]:
    """Runs, newest first: ``?job=&status=running&status=failed&before=<id>``."""
    bad = [s for s in status if not re.match(_STATUS, s)]
    if bad:
        raise ApiError(422, f"status {bad[0]!r} is not one of {', '.join((*LIVE, *FINAL))}")
    return await jobs.runs(job=job, status=status, before=before, limit=limit)


@router.get("/{run_id}", responses=errors(404, *BACKEND))
async def get_run(run_id: str, jobs: JobService = Depends(job_service)) -> RunView:
    """A run with its task timeline and queue figures (its log: ``GET /logs?run=``)."""
    return await jobs.run_view(run_id)


@router.get("/{run_id}/tasks", responses=errors(404, *BACKEND))
async def run_tasks(run_id: str, jobs: JobService = Depends(job_service)) -> list[TaskRecord]:
    """The run's tasks in start order: start, end, status, detail."""
    await jobs.store.run(run_id)
    return await jobs.store.run_tasks(run_id)


@router.post("/{run_id}/cancel", responses=errors(404, 409, *BACKEND))
async def cancel_run(run_id: str, jobs: JobService = Depends(job_service),
                     wait: float = Query(0, ge=0, le=300, description="seconds to wait for"
                                         " the run to end")) -> RunRecord:
    """Cancel this run on whichever host runs it, the job's other runs left alone
    (``POST /jobs/{name}/cancel`` stops them all): SIGTERM, then SIGKILL after
    ``control.grace`` seconds. 409 when the run is already over. The run as it is after
    ``wait`` seconds."""
    return await jobs.cancel_run(run_id, wait=wait or None)

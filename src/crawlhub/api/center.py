"""``/center/jobs/``: the download center's jobs - strategy, agents and the counters each
job's client last reported (sent, returned, in flight, failed)."""

from __future__ import annotations

from typing import Any

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep
from crawlhub.api.models import CenterJobs
from crawlhub.api.openapi import BACKEND, errors
from crawlhub.core.errors import ConflictError

router = routing.router(tags=["center"])


@router.get("/center/jobs/", summary="The download center's jobs", response_model=CenterJobs,
            responses=errors(409, *BACKEND))
async def list_center_jobs(svc: ServicesDep) -> dict[str, Any]:
    """Every job holding an allocation, sorted by job id; 409 when no center is configured
    (``center.url``)."""
    from crawlhub.center import center_jobs

    bus = svc.center_bus
    if bus is None:
        raise ConflictError("no download center is configured: set center.url")
    # a broker outage (a BusError caused by a connection error) is the app's 503
    return {"jobs": await center_jobs(bus)}

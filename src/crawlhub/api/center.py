"""``/center/jobs/``: the download center's jobs - strategy, agents and the counters each
job's client last reported (sent, returned, in flight, failed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from crawlhub.api.deps import ApiError, services
from crawlhub.api.openapi import BACKEND, errors
from crawlhub.service import Services

router = APIRouter(tags=["center"])


class CenterJob(BaseModel):
    job: str
    strategy: str = Field(description="random, fixed or chained")
    n: int = Field(description="agents asked for")
    agents: list[str] = Field(description="the agents allocated")
    created: float = Field(description="epoch seconds of the allocation")
    center: str = Field(description="the center that allocated it")
    sent: int = Field(description="requests sent (first sends)")
    returned: int = Field(description="requests answered")
    in_flight: int = Field(description="requests waiting for their answer")
    failed: int = Field(description="requests failed: no live agent, or unanswered")
    skipped: int = Field(description="chained requests whose agent was dead")
    retried: int = Field(description="sends again after a reply timeout")
    reported: float | None = Field(description="epoch seconds of the job's last report")


class CenterJobs(BaseModel):
    jobs: list[CenterJob]


@router.get("/center/jobs/", summary="The download center's jobs", response_model=CenterJobs,
            responses=errors(409, *BACKEND))
async def list_center_jobs(svc: Services = Depends(services)) -> dict[str, Any]:
    """Every job holding an allocation, sorted by job id; 409 when no center is configured
    (``center.url``)."""
    from crawlhub.center import center_jobs

    bus = svc.center_bus
    if bus is None:
        raise ApiError(409, "no download center is configured: set center.url")
    # a broker outage (a BusError caused by a connection error) is the app's 503
    return {"jobs": await center_jobs(bus)}

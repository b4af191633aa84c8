"""``/agents/``: the downloader agents registered on ``storage.agents`` (and the download
center's, on ``center.url``), alive or dead, with their last heartbeat."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from crawlhub.agents.registry import listing
from crawlhub.api.deps import services
from crawlhub.api.openapi import BACKEND, errors
from crawlhub.service import Services

router = APIRouter(tags=["agents"])


class AgentRow(BaseModel):
    agent_id: str
    host: str
    pid: int
    version: str
    queues: list[str] = Field(description="the outbound queues it leases from")
    started: float = Field(description="epoch seconds when it started")
    concurrency: int = Field(description="the most requests it runs at once")
    labels: dict[str, str]
    memory: int = Field(description="resident memory, bytes (last heartbeat)")
    cpu: float = Field(description="percent of one core since the heartbeat before")
    downloaders: int = Field(description="download slots busy")
    in_flight: int = Field(description="requests under way")
    qps: float = Field(description="requests per second since the heartbeat before")
    pages: int = Field(description="pages fetched since it started")
    errors: int = Field(description="failed fetches since it started")
    jobs: list[str] = Field(default_factory=list,
                            description="the download center's jobs allocated to it")
    last_seen: float = Field(description="epoch seconds of its last registration or"
                             " heartbeat")
    alive: bool = Field(description="heard from within dead_after seconds")
    beats: bool = Field(description="false until its first heartbeat (load fields are 0)")


class AgentList(BaseModel):
    dead_after: float = Field(description="seconds of silence after which an agent is dead")
    alive: int
    dead: int
    agents: list[AgentRow]


@router.get("/agents/", summary="Registered agents with their liveness",
            response_model=AgentList, responses=errors(422, *BACKEND))
async def list_agents(
    alive: bool | None = Query(None, description="only live (true) or dead (false) agents"),
    svc: Services = Depends(services),
) -> dict[str, Any]:
    """Every agent still known, sorted by id; a dead one is listed until the registry's
    retention forgets it."""
    more = [svc.center_registry] if svc.center_registry is not None else []
    return await listing(svc.agents, alive, more)

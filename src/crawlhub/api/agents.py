"""``/agents/``: the downloader agents registered on ``storage.agents`` (and the download
center's, on ``center.url``), alive or dead, with their last heartbeat."""

from __future__ import annotations

from typing import Any

from fastapi import Query

from crawlhub.agents.registry import listing
from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep
from crawlhub.api.models import AgentList
from crawlhub.api.openapi import BACKEND, errors

router = routing.router(tags=["agents"])


@router.get("/agents/", summary="Registered agents with their liveness",
            response_model=AgentList, responses=errors(422, *BACKEND))
async def list_agents(
    svc: ServicesDep,
    alive: bool | None = Query(None, description="only live (true) or dead (false) agents"),
) -> dict[str, Any]:
    """Every agent still known, sorted by id; a dead one is listed until the registry's
    retention forgets it."""
    more = [svc.center_registry] if svc.center_registry is not None else []
    return await listing(svc.agents, alive, more)

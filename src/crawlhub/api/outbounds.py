"""``GET /outbound/`` and ``GET /outbound/{prefix}``: config (secrets masked), queue
length and Left / Total / Success / Failed / Retried counters, and dispatch rate."""

from __future__ import annotations

from typing import Any

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep
from crawlhub.api.models import OutboundRow
from crawlhub.api.openapi import BACKEND, errors

router = routing.router(tags=["outbound"])


@router.get("/outbound/", summary="Every outbound with its counters",
            response_model=list[OutboundRow], responses=errors(*BACKEND))
async def list_outbounds(svc: ServicesDep) -> list[dict[str, Any]]:
    return await svc.outbounds()


@router.get("/outbound/{prefix}", summary="Outbounds whose name starts with prefix",
            response_model=list[OutboundRow], responses=errors(404, *BACKEND))
async def outbounds_by_prefix(prefix: str, svc: ServicesDep) -> list[dict[str, Any]]:
    return await svc.outbounds(prefix)  # none matches: NotFoundError, the app's 404

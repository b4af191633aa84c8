"""``GET /frontier/`` and ``GET /frontier/{name}``: each frontier's settings, current
segment, totals and per-segment stats (admitted, duplicates, pending, leased, done, ...)."""

from __future__ import annotations

from typing import Any

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep
from crawlhub.api.models import FrontierStats
from crawlhub.api.openapi import BACKEND, errors

router = routing.router(tags=["frontier"])


@router.get("/frontier/", summary="Every frontier with its per-segment stats",
            response_model=list[FrontierStats], responses=errors(*BACKEND))
async def list_frontiers(svc: ServicesDep) -> list[dict[str, Any]]:
    return [await f.describe() for f in svc.frontiers.values()]


@router.get("/frontier/{name}", summary="One frontier with its per-segment stats",
            response_model=FrontierStats, responses=errors(404, *BACKEND))
async def one_frontier(name: str, svc: ServicesDep) -> dict[str, Any]:
    return await svc.frontier(name).describe()  # unknown: NotFoundError, the app's 404

"""``GET /frontier/`` and ``GET /frontier/{name}``: each frontier's settings, current
segment, totals and per-segment stats (admitted, duplicates, pending, leased, done, ...)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

from crawlhub.api.openapi import BACKEND, errors

router = APIRouter(tags=["frontier"])


def _frontiers(request: Request) -> dict[str, Any]:
    return dict(getattr(request.app.state.services, "frontiers", None) or {})


@router.get("/frontier/", summary="Every frontier with its per-segment stats",
            responses=errors(*BACKEND))
async def list_frontiers(request: Request) -> list[dict[str, Any]]:
    return [await f.describe() for f in _frontiers(request).values()]


@router.get("/frontier/{name}", summary="One frontier with its per-segment stats",
            responses=errors(404, *BACKEND))
async def one_frontier(name: str, request: Request) -> dict[str, Any]:
    frontiers = _frontiers(request)
    frontier = frontiers.get(name)
    if frontier is None:
        known = ", ".join(sorted(frontiers)) or "none is configured (add a 'frontier:' section)"
        raise HTTPException(404, f"no frontier named {name!r}; known: {known}")
    result: dict[str, Any] = await frontier.describe()
    return result

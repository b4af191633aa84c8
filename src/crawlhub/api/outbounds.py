"""``GET /outbound/`` and ``GET /outbound/{prefix}``: config (secrets masked), queue
length and Left / Total / Success / Failed / Retried counters, and dispatch rate."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from crawlhub.api.deps import ApiError, services
from crawlhub.api.openapi import BACKEND, OutboundRow, errors
from crawlhub.config import redact
from crawlhub.service import Services

router = APIRouter(tags=["outbound"])


async def _rows(svc: Services, prefix: str) -> list[dict[str, Any]]:
    configs = {ob.name: ob for ob in svc.config.outbound}
    rows = await svc.hub.outbound_stats(prefix)
    for row in rows:
        cfg = configs[row["name"]]
        row["config"] = redact(cfg.model_dump(mode="json", by_alias=True,
                                              exclude={"source_file", "source_index"}))
    return rows


@router.get("/outbound/", summary="Every outbound with its counters",
            response_model=list[OutboundRow], responses=errors(*BACKEND))
async def list_outbounds(svc: Services = Depends(services)) -> list[dict[str, Any]]:
    return await _rows(svc, "")


@router.get("/outbound/{prefix}", summary="Outbounds whose name starts with prefix",
            response_model=list[OutboundRow], responses=errors(404, *BACKEND))
async def outbounds_by_prefix(prefix: str, svc: Services = Depends(services)
                              ) -> list[dict[str, Any]]:
    rows = await _rows(svc, prefix)
    if not rows:
        raise ApiError(404, f"no outbound name starts with {prefix!r}")
    return rows

"""``POST /inbound/{name}/`` (push messages or results into an http inbound) and
``POST /inbound/{name}/check_task/`` (dry run: what would happen, nothing changes)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from crawlhub.api.deps import ApiError, json_body, objects, services
from crawlhub.api.openapi import BACKEND, BODY, errors, json_request
from crawlhub.errors import BackpressureError, ConvertError
from crawlhub.hub.hub import Inbound
from crawlhub.service import Services

router = APIRouter(tags=["inbound"])


def _inbound(svc: Services, name: str) -> Inbound:
    try:
        return svc.hub.inbound(name)
    except KeyError as exc:
        raise ApiError(404, str(exc.args[0])) from None


@router.get("/inbound/", summary="List inbounds")
async def list_inbounds(svc: Services = Depends(services)) -> list[dict[str, Any]]:
    return [
        {"name": i.name, "class": i.class_name, "disabled": i.disabled, "derive": i.derive,
         "selector": list(i.selectors.texts), "frontier": i.frontier}
        for i in svc.hub.inbounds.values()
    ]


@router.post("/inbound/{name}/", summary="Push messages into an http inbound",
             responses=errors(404, 409, *BODY, *BACKEND),
             openapi_extra=json_request("One message (a JSON object) or a list"))
async def push(name: str, request: Request, svc: Services = Depends(services)) -> JSONResponse:
    inbound = _inbound(svc, name)
    if not inbound.is_http:
        raise ApiError(409, f"inbound {name!r} is of class {inbound.class_name!r}; only http"
                       " inbounds take messages over HTTP")
    if inbound.disabled:
        raise ApiError(409, f"inbound {name!r} is disabled")
    body = await json_body(request)
    items, many = objects(body, what="message", limit=svc.config.server.max_tasks_per_request)
    try:
        outcomes = await svc.hub.receive(name, items)
    except BackpressureError as exc:
        raise ApiError(503, str(exc), retry_after=exc.retry_after) from None
    except ConvertError as exc:
        raise ApiError(422, str(exc)) from None
    deferred = any(o.get("status") == "deferred" for o in outcomes)
    payload: Any = {"messages": outcomes} if many else outcomes[0]
    return JSONResponse(payload, status_code=503 if deferred else 200,
                        headers={"Retry-After": "1"} if deferred else None)


@router.post("/inbound/{name}/check_task/", summary="Dry run of a message on an inbound",
             responses=errors(404, *BODY, *BACKEND),
             openapi_extra=json_request("One message (a JSON object, or a list of one)",
                                        max_items=1))
async def check_task(name: str, request: Request,
                     svc: Services = Depends(services)) -> dict[str, Any]:
    """The converted task, the selector that matched, the outbound that would take it and
    the exact params it would send — or why nothing would. Changes nothing."""
    _inbound(svc, name)
    body = await json_body(request)
    items, _ = objects(body, what="message", limit=1)
    try:
        return await svc.hub.check_task(name, items[0])
    except ConvertError as exc:
        raise ApiError(422, str(exc)) from None

"""``POST /inbound/{name}/`` (push messages or results into an http inbound) and
``POST /inbound/{name}/check_task/`` (dry run: what would happen, nothing changes)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep, json_body, objects
from crawlhub.api.models import InboundRow
from crawlhub.api.openapi import BACKEND, BODY, errors, json_request
from crawlhub.core.errors import ConflictError

router = routing.router(tags=["inbound"])


@router.get("/inbound/", summary="List inbounds", response_model=list[InboundRow])
async def list_inbounds(svc: ServicesDep) -> list[dict[str, Any]]:
    return [
        {"name": p.name, "class": p.class_name, "disabled": p.disabled, "derive": p.derive,
         "selector": list(p.selectors.texts), "frontier": p.frontier}
        for p in (i.plan for i in svc.hub.inbounds.values())
    ]


# An unknown inbound is the hub's NotFoundError (404), a converter failing on a message
# its ConvertError (422), an outbound over max_lag its BackpressureError (503): the app
# answers them (crawlhub.api.errors).
@router.post("/inbound/{name}/", summary="Push messages into an http inbound",
             responses=errors(404, 409, *BODY, *BACKEND),
             openapi_extra=json_request("One message (a JSON object) or a list"))
async def push(name: str, request: Request, svc: ServicesDep) -> JSONResponse:
    inbound = svc.hub.inbound(name).plan
    if not inbound.is_http:
        raise ConflictError(f"inbound {name!r} is of class {inbound.class_name!r}; only http"
                            " inbounds take messages over HTTP")
    if inbound.disabled:
        raise ConflictError(f"inbound {name!r} is disabled")
    body = await json_body(request)
    items, many = objects(body, what="message", limit=svc.config.server.max_tasks_per_request)
    outcomes = await svc.hub.receive(name, items)
    deferred = any(o.get("status") == "deferred" for o in outcomes)
    payload: Any = {"messages": outcomes} if many else outcomes[0]
    return JSONResponse(payload, status_code=503 if deferred else 200,
                        headers={"Retry-After": "1"} if deferred else None)


@router.post("/inbound/{name}/check_task/", summary="Dry run of a message on an inbound",
             responses=errors(404, *BODY, *BACKEND),
             openapi_extra=json_request("One message (a JSON object, or a list of one)",
                                        max_items=1))
async def check_task(name: str, request: Request, svc: ServicesDep) -> dict[str, Any]:
    """The converted task, the selector that matched, the outbound that would take it and
    the exact params it would send — or why nothing would. Changes nothing."""
    svc.hub.inbound(name)  # (an unknown inbound is a 404 before the body is read)
    body = await json_body(request)
    items, _ = objects(body, what="message", limit=1)
    return await svc.hub.check_task(name, items[0])

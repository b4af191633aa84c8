"""``POST /task/``: submit one task or a list; each gets its uuid and outbound."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from crawlhub.api.deps import ApiError, json_body, objects, services
from crawlhub.errors import BackpressureError
from crawlhub.service import Services

router = APIRouter(tags=["tasks"])


@router.post("/task/", summary="Submit one task or a list of tasks")
async def submit_task(request: Request, svc: Services = Depends(services)) -> JSONResponse:
    """Route each task to the first outbound whose selector matches.

    One object answers ``{task_uuid, outbound, status}`` (422 if no outbound takes it);
    a list answers ``{accepted, tasks: [...]}`` with a status per task. An outbound over
    its ``max_lag`` makes the whole request 503 with ``Retry-After``; nothing is written.
    """
    body = await json_body(request)
    items, many = objects(body, limit=svc.config.server.max_tasks_per_request)
    try:
        results = await svc.hub.submit(items)
    except BackpressureError as exc:
        raise ApiError(503, str(exc), retry_after=exc.retry_after) from None
    answers = [r.as_dict() for r in results]
    deferred = [r for r in results if r.status == "deferred"]
    headers = {"Retry-After": "1"} if deferred else None
    if not many:
        answer = answers[0]
        if results[0].status == "rejected":
            raise ApiError(422, f"task not routed: {results[0].reason}",
                           task_uuid=results[0].task_uuid)
        status = 503 if deferred else 200
        return JSONResponse(answer, status_code=status, headers=headers)
    accepted = sum(1 for r in results if r.status == "routed")
    payload = {"accepted": accepted, "tasks": answers}
    if deferred:
        return JSONResponse(payload, status_code=503, headers=headers)
    if accepted == 0 and all(r.status == "rejected" for r in results):
        return JSONResponse({"detail": "no task was routed", **payload}, status_code=422)
    return JSONResponse(payload)

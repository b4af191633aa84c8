"""``POST /task/``: submit one task or a list; each gets its uuid and outbound."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from crawlhub.api import routing
from crawlhub.api.deps import ApiError, FastJSONResponse, ServicesDep, json_body, objects
from crawlhub.api.models import BatchAnswer, TaskAnswer
from crawlhub.api.openapi import BACKEND, BODY, errors, json_request

router = routing.router(tags=["tasks"])

#: Task statuses that mean "not kept: send it again after Retry-After".
RETRY_LATER = frozenset({"deferred", "unavailable"})


@router.post("/task/", summary="Submit one task or a list of tasks",
             responses={**errors(*BODY, *BACKEND),
                        200: {"model": TaskAnswer | BatchAnswer,
                              "description": "One task's answer, or a list's"}, 207: {
                 "description": "A list of which some tasks were pushed and others not"
                 " (status unavailable: an outbound's backend is out of reach): send again"
                 " only those not routed, after Retry-After seconds"}},
             openapi_extra=json_request("One task (a JSON object) or a list of tasks"))
async def submit_task(request: Request, svc: ServicesDep) -> JSONResponse:
    """Route each task to the first outbound whose selector matches.

    One object answers ``{task_uuid, outbound, status}`` (422 if no outbound takes it);
    a list answers ``{accepted, tasks: [...]}`` with a status per task. An outbound over
    its ``max_lag`` makes the whole request 503 with ``Retry-After``; nothing is written.
    Tasks that could not be pushed because a backend is out of reach (``unavailable``)
    or that were held back (``deferred``) make the answer 503 with ``Retry-After``: send
    them again (tasks already routed answer ``already_routed`` then, not twice). When
    others of the list were pushed (one outbound's backend down), the answer is 207
    with the status of each task instead: send again only those not routed.
    """
    body = await json_body(request)
    items, many = objects(body, limit=svc.config.server.max_tasks_per_request)
    # (json_body refuses NaN and infinities, objects() tasks nested too deeply: checked)
    results = await svc.hub.submit(items, checked=True)  # over max_lag: BackpressureError
    answers = [r.as_dict() for r in results]
    retry = [r for r in results if r.status in RETRY_LATER]
    failed = [r for r in results if r.status == "failed"]
    headers = {"Retry-After": "1"} if retry else None
    if not many:
        result, answer = results[0], answers[0]
        if result.status == "rejected":
            raise ApiError(422, f"task not routed: {result.reason}",
                           task_uuid=result.task_uuid)
        if retry or failed:
            return FastJSONResponse({"detail": f"task not routed: {result.reason}",
                                     **answer}, status_code=503 if retry else 500,
                                    headers=headers)
        return FastJSONResponse(answer)
    accepted = sum(1 for r in results if r.status == "routed")
    payload = {"accepted": accepted, "tasks": answers}
    if retry or failed:
        not_routed = retry or failed
        # Some tasks pushed, some not (one outbound's backend down): 207, so a client
        # that retries on 5xx does not send the pushed ones again under new uuids.
        pushed = any(r.status in ("routed", "already_routed") for r in results)
        code = 207 if pushed and not any(r.status == "deferred" for r in results) else (
            503 if retry else 500)
        return FastJSONResponse({"detail": f"{len(not_routed)} tasks not routed: send them"
                                 f" again ({not_routed[0].reason})", **payload},
                                status_code=code, headers=headers)
    if accepted == 0 and all(r.status == "rejected" for r in results):
        return FastJSONResponse({"detail": "no task was routed", **payload}, status_code=422)
    return FastJSONResponse(payload)

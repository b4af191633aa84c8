"""``/alerts/``: alert routes per job (webhook or email), their test button and the
record of what was sent.

A webhook URL is write-only: it is stored encrypted and answered as ``target``
(``https://hooks.slack.com/***``), never in full. ``POST /alerts/{name}/test`` answers
200 whether or not the target took the message: ``ok`` says which, ``error`` why not (a
button shows it as it is); 404 only when there is no such route. The answer holds the
target's HTTP status and the time taken, never its body: a route must not be a way to
read internal URLs. Which hosts a route may name is the server's policy
(``control.alert_allowed_hosts``, ``control.alert_denied_networks``).
"""

from __future__ import annotations

from fastapi import Depends, Query, Response
from pydantic import BaseModel, Field

from crawlhub.api import routing
from crawlhub.api.deps import ApiError, ServicesDep, control_plane
from crawlhub.api.openapi import BACKEND, BODY, errors
from crawlhub.control.alerts import (
    EVENT_KINDS,
    AlertError,
    AlertRoute,
    AlertService,
    RoutePatch,
    RouteSpec,
)

router = routing.router(prefix="/alerts", tags=["alerts"])


def alert_service(svc: ServicesDep) -> AlertService:
    """The control plane's alerts (503 while the control plane is not open)."""
    return control_plane(svc).alerts


class AlertRouteOut(BaseModel):
    """A stored alert route (the webhook URL never shown: ``target`` is its scheme and
    host, or the email addresses)."""

    name: str
    kind: str = Field(description="webhook or email")
    target: str = Field(description="where it sends: scheme://host/*** or the addresses")
    to: list[str] = Field(description="email: the recipients")
    events: list[str] = Field(description=f"of {', '.join(EVENT_KINDS)}")
    jobs: list[str] = Field(description="run events: job names or glob patterns (empty:"
                            " every job)")
    queues: list[str] = Field(description="queue_stalled: queue names or glob patterns"
                              " (empty: every queue)")
    enabled: bool
    created: float = Field(description="epoch seconds")
    updated: float = Field(description="epoch seconds")

    @classmethod
    def of(cls, route: AlertRoute) -> AlertRouteOut:
        return cls.model_validate(route.as_dict())


class AlertTestAnswer(BaseModel):
    """What the target said to the test message."""

    ok: bool = Field(description="the target took it (HTTP 2xx, SMTP 250)")
    route: str
    answer: str = Field(description="the target's answer: its HTTP status ('HTTP 200'; never"
                        " its body) or the SMTP server's reply ('250 OK')")
    error: str = Field(description="why it failed (empty when ok)")
    attempts: int
    elapsed: float = Field(description="seconds the attempt took")


class DeliveryOut(BaseModel):
    """One alert sent (or not) to one route."""

    id: str
    route: str
    event: str = Field(description="the event kind, or 'test'")
    job: str | None
    run: str | None
    about: str = Field(description="job:<name>, agent:<id> or queue:<name>")
    subject: str
    status: str = Field(description="sent or failed")
    attempts: int
    answer: str
    error: str
    ts: float


@router.get("/", summary="Every alert route", response_model=list[AlertRouteOut],
            responses=errors(*BACKEND))
async def list_routes(alerts: AlertService = Depends(alert_service)) -> list[AlertRouteOut]:
    return [AlertRouteOut.of(r) for r in await alerts.routes()]


@router.post("/", summary="Add an alert route", status_code=201,
             response_model=AlertRouteOut, responses=errors(*BODY, 409, *BACKEND))
async def create_route(body: RouteSpec, alerts: AlertService = Depends(alert_service)
                       ) -> AlertRouteOut:
    """A webhook (``{"name", "kind": "webhook", "url": "https://hooks.slack.com/..."}``)
    or email route (``{"name", "kind": "email", "to": ["ops@example.com"]}``), with the
    ``events`` it wants (default: all) and the ``jobs`` / ``queues`` it is for. 422 when
    the webhook's host is not in ``control.alert_allowed_hosts`` (when set) or is, or
    resolves to, an address in ``control.alert_denied_networks``."""
    try:
        return AlertRouteOut.of(await alerts.create(body))
    except AlertError as exc:
        raise ApiError(422, str(exc)) from None


@router.get("/deliveries", summary="Alerts sent, newest first",
            response_model=list[DeliveryOut], responses=errors(422, *BACKEND))
async def deliveries(
    route: str | None = Query(None, max_length=64, description="only this route's"),
    job: str | None = Query(None, max_length=200, description="only this job's"),
    limit: int = Query(100, ge=1, le=1000),
    alerts: AlertService = Depends(alert_service),
) -> list[DeliveryOut]:
    rows = await alerts.deliveries(route=route, job=job, limit=limit)
    return [DeliveryOut.model_validate(d.as_dict()) for d in rows]


@router.get("/{name}", summary="One alert route", response_model=AlertRouteOut,
            responses=errors(404, *BACKEND))
async def get_route(name: str, alerts: AlertService = Depends(alert_service)
                    ) -> AlertRouteOut:
    return AlertRouteOut.of(await alerts.get(name))


@router.patch("/{name}", summary="Change an alert route", response_model=AlertRouteOut,
              responses=errors(*BODY, 404, *BACKEND))
async def patch_route(name: str, body: RoutePatch,
                      alerts: AlertService = Depends(alert_service)) -> AlertRouteOut:
    """The fields given replace the stored ones (``{"enabled": false}`` mutes a route);
    switching ``kind`` needs the other kind's target in the same request."""
    try:
        return AlertRouteOut.of(await alerts.update(name, body))
    except AlertError as exc:  # the merged route is not valid (email without addresses)
        raise ApiError(422, str(exc)) from None


@router.delete("/{name}", summary="Remove an alert route", status_code=204,
               response_class=Response, responses=errors(404, *BACKEND))
async def delete_route(name: str, alerts: AlertService = Depends(alert_service)) -> Response:
    await alerts.delete(name)
    return Response(status_code=204)


@router.post("/{name}/test", summary="Send a test message now",
             response_model=AlertTestAnswer, responses=errors(404, *BACKEND))
async def test_route(name: str, alerts: AlertService = Depends(alert_service)) -> AlertTestAnswer:
    """One attempt, answered when the target has answered (or after
    ``control.alert_timeout``). 200 either way: ``ok`` false and ``error`` when the target
    refused or could not be reached. Works on a disabled route too."""
    result = await alerts.test(name)
    return AlertTestAnswer.model_validate(result.as_dict())

"""``/ui/alerts``: alert routes (name, kind, target masked, events, jobs, queues) with a
"test" button on ``POST /alerts/{name}/test`` that shows the target's answer, and the
alerts sent, newest first, refreshed every 2 s."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from crawlhub.api import routing
from crawlhub.api.alerts import AlertRouteOut, DeliveryOut
from crawlhub.api.deps import ServicesDep, control_plane
from crawlhub.control.alerts import EVENT_KINDS
from crawlhub.services import Services
from crawlhub.web.paging import Page, keyset, number_param, text_param
from crawlhub.web.render import Area, Card, Stat, attempt, fragment, number, page

router = routing.router()
STORE = "the alert routes (control.url)"
ROUTES_PAGE = 50
#: Deliveries shown (the store keeps the newest ``control.alert_max_deliveries``).
DELIVERIES = 100


async def _routes(svc: Services) -> list[AlertRouteOut]:
    return [AlertRouteOut.of(r) for r in await control_plane(svc).alerts.routes()]


async def _deliveries(svc: Services, route: str | None, job: str | None,
                      limit: int) -> list[DeliveryOut]:
    rows = await control_plane(svc).alerts.deliveries(route=route, job=job, limit=limit)
    return [DeliveryOut.model_validate(d.as_dict()) for d in rows]


async def _deliveries_data(request: Request, svc: Services) -> dict[str, Any]:
    route, job = text_param(request, "route", 64), text_param(request, "job", 200)
    found, error = await attempt(
        _deliveries(svc, route, job, number_param(request, "limit", DELIVERIES, high=1000)),
        STORE)
    return {"deliveries": found or [], "deliveries_error": error, "route": route or "",
            "job": job or ""}


@router.get("/ui/alerts")
async def alerts_page(request: Request, svc: ServicesDep) -> HTMLResponse:
    routes, error = await attempt(_routes(svc), STORE)
    p = request.query_params
    shown: Page[AlertRouteOut] = keyset(routes or [], lambda r: r.name, after=p.get("after"),
                                        before=p.get("before"),
                                        limit=number_param(request, "limit", ROUTES_PAGE))
    return page(request, "alerts.html", area="alerts", title="Alerts", routes=shown,
                error=error, events=EVENT_KINDS, **await _deliveries_data(request, svc))


@router.get("/ui/alerts/live")
async def deliveries_live(request: Request, svc: ServicesDep) -> HTMLResponse:
    """The deliveries block (the routes table holds the test buttons' answers: it is not
    swapped)."""
    return fragment(request, "alerts_live.html", area="alerts",
                    **await _deliveries_data(request, svc))


async def summary(svc: Services) -> Card:
    card = Card("Alerts", AREA.path)

    async def figures() -> tuple[list[AlertRouteOut], list[DeliveryOut]]:
        return await _routes(svc), await _deliveries(svc, None, None, 20)

    found, card.error = await attempt(figures(), STORE)
    if found is not None:
        routes, newest = found
        failed = sum(1 for d in newest if d.status != "sent")
        card.stats = [Stat("routes", number(len(routes))),
                      Stat("muted", number(sum(1 for r in routes if not r.enabled)),
                           "wait" if any(not r.enabled for r in routes) else ""),
                      Stat("sent", number(sum(1 for d in newest if d.status == "sent")),
                           "good"),
                      Stat("failed", number(failed), "bad" if failed else "")]
        if newest:
            card.note = "of the newest 20 alerts"
    return card


AREA = Area("alerts", "Alerts", "/ui/alerts", summary)

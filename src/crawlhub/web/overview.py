"""``/``: the overview - one card per area present (agents, outbounds and queues, frontier,
and the control plane's areas once their pages land), refreshed every 2 s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from crawlhub.api.deps import ServicesDep
from crawlhub.service import Services
from crawlhub.web.render import Area, Card, areas, fragment, page

router = APIRouter()


async def _cards(svc: Services) -> list[Card]:
    return [await area.summary(svc) for area in areas() if area.summary is not None]


@router.get("/")
async def overview_page(request: Request, svc: ServicesDep) -> HTMLResponse:
    return page(request, "overview.html", area="overview", title="Overview",
                cards=await _cards(svc))


@router.get("/ui/overview/live")
async def overview_live(request: Request, svc: ServicesDep) -> HTMLResponse:
    return fragment(request, "overview_live.html", area="overview", cards=await _cards(svc))


AREA = Area("overview", "Overview", "/")

"""``/``: the overview - one card per area (agents, outbounds and queues, frontier,
projects and builds, jobs, runs, alerts), refreshed every 2 s."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from crawlhub.api import routing
from crawlhub.services import Services
from crawlhub.web.render import Area, areas, live_page

router = routing.router()


async def _data(request: Request, svc: Services) -> dict[str, Any]:
    return {"cards": [await area.summary(svc) for area in areas()
                      if area.summary is not None]}


live_page(router, "/", "overview", area="overview", title="Overview", data=_data,
          live_path="/ui/overview/live")


AREA = Area("overview", "Overview", "/")

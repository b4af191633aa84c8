"""``/ui/agents``: every downloader agent with its liveness (alive or dead, age of its last
heartbeat) and load (downloaders, requests in flight, QPS, CPU, memory), read as
``GET /agents/`` reads it; paged by agent id, refreshed every 2 s."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from crawlhub.agents.registry import listing
from crawlhub.api.deps import ServicesDep
from crawlhub.api.models import AgentList
from crawlhub.service import Services
from crawlhub.web.paging import keyset, limit_of
from crawlhub.web.render import Area, Card, Stat, attempt, fragment, number, page

router = APIRouter()
REGISTRY = "the agent registry (storage.agents)"


async def _listing(svc: Services) -> AgentList:
    more = [svc.center_registry] if svc.center_registry is not None else []
    return AgentList.model_validate(await listing(svc.agents, None, more))


async def _data(svc: Services, show: str | None, after: str | None, before: str | None,
                limit: int | None) -> dict[str, Any]:
    found, error = await attempt(_listing(svc), REGISTRY)
    found = found or AgentList(dead_after=0, alive=0, dead=0, agents=[])
    rows = found.agents
    if show in ("alive", "dead"):
        rows = [r for r in rows if r.alive is (show == "alive")]
    return {"agents": keyset(rows, lambda r: r.agent_id, after=after, before=before,
                             limit=limit_of(limit)),
            "counts": found, "error": error, "show": show or "all"}


@router.get("/ui/agents")
async def agents_page(request: Request, svc: ServicesDep, show: str | None = None,
                      after: str | None = None, before: str | None = None,
                      limit: int | None = None) -> HTMLResponse:
    return page(request, "agents.html", area="agents", title="Agents",
                **await _data(svc, show, after, before, limit))


@router.get("/ui/agents/live")
async def agents_live(request: Request, svc: ServicesDep, show: str | None = None,
                      after: str | None = None, before: str | None = None,
                      limit: int | None = None) -> HTMLResponse:
    return fragment(request, "agents_live.html", area="agents",
                    **await _data(svc, show, after, before, limit))


async def summary(svc: Services) -> Card:
    card = Card("Agents", AREA.path)
    found, card.error = await attempt(_listing(svc), REGISTRY)
    if found is not None:
        live = [r for r in found.agents if r.alive]
        card.stats = [
            Stat("alive", number(found.alive), "good" if found.alive else ""),
            Stat("dead", number(found.dead), "bad" if found.dead else ""),
            Stat("downloaders", number(sum(r.downloaders for r in live))),
            Stat("QPS", f"{sum(r.qps for r in live):,.1f}"),
        ]
    return card


AREA = Area("agents", "Agents", "/ui/agents", summary)

"""``/ui/agents``: every downloader agent with its liveness (alive or dead, age of its last
heartbeat) and load (downloaders, requests in flight, QPS, CPU, memory), read as
``GET /agents/`` reads it; paged by agent id, refreshed every 2 s."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from crawlhub.agents.registry import listing
from crawlhub.service import Services
from crawlhub.web.paging import keyset, limit_of
from crawlhub.web.render import Area, Card, Stat, attempt, fragment, number, page

router = APIRouter()


async def _listing(svc: Services) -> dict[str, Any]:
    more = [svc.center_registry] if svc.center_registry is not None else []
    return await listing(svc.agents, None, more)


async def _data(request: Request, alive: str | None, after: str | None, before: str | None,
                limit: int | None) -> dict[str, Any]:
    svc: Services = request.app.state.services
    found, error = await attempt(_listing(svc), "the agent registry (storage.agents)")
    found = found or {"agents": [], "alive": 0, "dead": 0, "dead_after": 0}
    rows = found["agents"]
    if alive in ("alive", "dead"):
        rows = [r for r in rows if r["alive"] is (alive == "alive")]
    return {"agents": keyset(rows, lambda r: r["agent_id"], after=after, before=before,
                             limit=limit_of(limit)),
            "counts": found, "error": error, "show": alive or "all"}


@router.get("/ui/agents")
async def agents_page(request: Request, show: str | None = Query(None),
                      after: str | None = None, before: str | None = None,
                      limit: int | None = None) -> HTMLResponse:
    return page(request, "agents.html", area="agents", title="Agents",
                **await _data(request, show, after, before, limit))


@router.get("/ui/agents/live")
async def agents_live(request: Request, show: str | None = Query(None),
                      after: str | None = None, before: str | None = None,
                      limit: int | None = None) -> HTMLResponse:
    return fragment(request, "agents_live.html", area="agents",
                    **await _data(request, show, after, before, limit))


async def summary(request: Request) -> Card:
    card = Card("Agents", AREA.path)
    found, card.error = await attempt(_listing(request.app.state.services),
                                      "the agent registry (storage.agents)")
    if found is not None:
        live = [r for r in found["agents"] if r["alive"]]
        card.stats = [
            Stat("alive", number(found["alive"]), "good" if found["alive"] else ""),
            Stat("dead", number(found["dead"]), "bad" if found["dead"] else ""),
            Stat("downloaders", number(sum(r["downloaders"] for r in live))),
            Stat("QPS", f"{sum(r['qps'] for r in live):,.1f}"),
        ]
    return card


AREA = Area("agents", "Agents", "/ui/agents", summary)

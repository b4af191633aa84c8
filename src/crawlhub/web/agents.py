"""``/ui/agents``: every downloader agent with its liveness (alive or dead, age of its last
heartbeat) and load (downloaders, requests in flight, QPS, CPU, memory), read as
``GET /agents/`` reads it; paged by agent id, refreshed every 2 s. Below, each domain's
adaptive politeness shared by the agents (limit, delay, latency, error rate)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from crawlhub.agents.politeness import domain_figures
from crawlhub.agents.registry import listing
from crawlhub.api import routing
from crawlhub.api.models import AgentList
from crawlhub.services import Services
from crawlhub.web.paging import PAGE_SIZE, keyset, number_param
from crawlhub.web.render import Area, Card, Stat, attempt, live_page, number

router = routing.router()
REGISTRY = "the agent registry (storage.agents)"
#: domains shown with their adaptive politeness (those answered last)
DOMAINS = 50


async def _listing(svc: Services) -> AgentList:
    more = [svc.center_registry] if svc.center_registry is not None else []
    return AgentList.model_validate(await listing(svc.agents, None, more))


async def _data(request: Request, svc: Services) -> dict[str, Any]:
    p = request.query_params
    show = p.get("show")
    found, error = await attempt(_listing(svc), REGISTRY)
    found = found or AgentList(dead_after=0, alive=0, dead=0, agents=[])
    rows = found.agents
    if show in ("alive", "dead"):
        rows = [r for r in rows if r.alive is (show == "alive")]
    storage = svc.config.storage
    domains, domains_error = await attempt(
        domain_figures(storage.agents_url, prefix=storage.redis_prefix, limit=DOMAINS),
        "the domain gate (storage.agents)")
    return {"domains": domains or [], "domains_error": domains_error,
            "agents": keyset(rows, lambda r: r.agent_id, after=p.get("after"),
                             before=p.get("before"),
                             limit=number_param(request, "limit", PAGE_SIZE)),
            "counts": found, "error": error, "show": show or "all"}


live_page(router, "/ui/agents", "agents", area="agents", title="Agents", data=_data)


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

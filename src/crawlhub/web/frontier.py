"""``/ui/frontier``: every frontier with its totals (admitted, duplicates, pending, leased,
done, failed, dispatched) and current segment, and the chosen frontier's segments newest
first, paged; as ``GET /frontier/`` reads them, refreshed every 2 s."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from crawlhub.api import routing
from crawlhub.api.models import FrontierStats, SegmentStats
from crawlhub.core.redact import redact_url
from crawlhub.services import Services
from crawlhub.web.paging import PAGE_SIZE, Page, keyset, number_param
from crawlhub.web.render import Area, Card, Stat, attempt, live_page, number

router = routing.router()


async def _describe_all(svc: Services) -> list[FrontierStats]:
    return [FrontierStats.model_validate(await f.describe()) for f in svc.frontiers.values()]


async def _data(request: Request, svc: Services) -> dict[str, Any]:
    p = request.query_params
    frontiers, error = await attempt(
        _describe_all(svc), f"the frontier store ({redact_url(svc.config.storage.frontier)})")
    frontiers = frontiers or []
    chosen = next((f for f in frontiers if f.name == p.get("name")),
                  frontiers[0] if frontiers else None)
    segments: Page[SegmentStats] = Page()
    if chosen is not None:
        limit = number_param(request, "limit", PAGE_SIZE)
        segments = keyset(chosen.segments, lambda s: s.segment, after=p.get("seg_after"),
                          before=p.get("seg_before"), limit=limit, descending=True,
                          parse=int)
    return {"frontiers": frontiers, "chosen": chosen, "segments": segments, "error": error,
            "configured": bool(svc.frontiers)}


live_page(router, "/ui/frontier", "frontier", area="frontier", title="Frontier", data=_data)


async def summary(svc: Services) -> Card:
    card = Card("Frontier", AREA.path)
    if not svc.frontiers:
        card.note = "no frontier is configured (a 'frontier:' section)"
        return card
    found, card.error = await attempt(_describe_all(svc), "the frontier store")
    if found is not None:
        def total(name: str) -> int:
            return sum(getattr(f.totals, name) for f in found or [])

        card.stats = [Stat("frontiers", number(len(found))),
                      Stat("admitted", number(total("admitted"))),
                      Stat("duplicates", number(total("duplicates"))),
                      Stat("pending", number(total("pending")),
                           "busy" if total("pending") else ""),
                      Stat("done", number(total("done")), "good"),
                      Stat("failed", number(total("failed")), "bad" if total("failed") else "")]
    return card


AREA = Area("frontier", "Frontier", "/ui/frontier", summary)

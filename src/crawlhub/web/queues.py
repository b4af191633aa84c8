"""``/ui/queues``: every outbound (Left / Total / Success / Failed / Retried and the rate
tasks are dispatched to it, as ``GET /outbound/`` reads them) and every reliable queue
(Left, ready, leased, Total, Success, Failed, Retried, dead, and how fast messages are
finished); two tables, each paged by name, refreshed every 2 s."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from fastapi import Request

from crawlhub.api import routing
from crawlhub.api.models import OutboundRow, QueueStatsRow
from crawlhub.core.redact import redact_url
from crawlhub.services import Services
from crawlhub.web.paging import PAGE_SIZE, Page, keyset, number_param
from crawlhub.web.render import (
    Area,
    Card,
    Stat,
    attempt,
    live_page,
    number,
    per_second,
)

router = routing.router()


class RateMeter:
    """Messages finished (success + failed) per second per queue, from the counters read
    on successive renders over the last :attr:`window` seconds: queues keep totals, not
    rates, so a rate shows from the second look on (None before)."""

    def __init__(self, window: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._samples: dict[str, deque[tuple[float, int]]] = {}

    def rate(self, name: str, done: int) -> float | None:
        now = self.clock()
        samples = self._samples.setdefault(name, deque())
        if not samples or now - samples[-1][0] >= 0.5:  # many viewers: one sample per 0.5 s
            samples.append((now, done))
        while now - samples[0][0] > self.window:  # the look just taken always stays
            samples.popleft()
        first_at, first_done = samples[0]
        if now - first_at < 1.0:
            return None
        return max(done - first_done, 0) / (now - first_at)


_meters: WeakKeyDictionary[Services, RateMeter] = WeakKeyDictionary()


def _meter(svc: Services) -> RateMeter:
    meter = _meters.get(svc)
    if meter is None:
        meter = _meters[svc] = RateMeter()
    return meter


async def _outbounds(svc: Services) -> list[OutboundRow]:
    return [OutboundRow.model_validate(row) for row in await svc.outbounds()]


async def _queue_page(svc: Services, after: str | None, before: str | None,
                      limit: int) -> Page[QueueStatsRow]:
    # names first, stats for the shown page only: one read per queue on the page
    names = keyset(sorted(await svc.queues.names()), lambda n: n, after=after,
                   before=before, limit=limit)
    meter = _meter(svc)
    rows = []
    for name in names.rows:
        row = QueueStatsRow.model_validate(
            (await svc.queues.queue(name).stats()).as_dict())
        row.rate = meter.rate(name, row.success + row.failed)  # type: ignore[attr-defined]
        rows.append(row)
    return Page(rows=rows, prev=names.prev, next=names.next, total=names.total,
                first=names.first)


async def _data(request: Request, svc: Services) -> dict[str, Any]:
    p = request.query_params
    limit = number_param(request, "limit", PAGE_SIZE)
    outbounds, out_error = await attempt(_outbounds(svc), "the hub state")
    queues, q_error = await attempt(
        _queue_page(svc, p.get("q_after"), p.get("q_before"), limit),
        f"the queues ({redact_url(svc.config.storage.queues)})")
    return {
        "outbounds": keyset(outbounds or [], lambda r: r.name, after=p.get("out_after"),
                            before=p.get("out_before"), limit=limit),
        "queues": queues or Page(), "out_error": out_error, "q_error": q_error,
    }


live_page(router, "/ui/queues", "queues", area="queues", title="Queues", data=_data)


async def summary(svc: Services) -> Card:
    card = Card("Outbounds and queues", AREA.path)
    rows, card.error = await attempt(_outbounds(svc), "the hub state")
    if rows is not None:
        left = sum(r.left or 0 for r in rows)
        down = sum(1 for r in rows if not r.available)
        failed = sum(r.failed for r in rows)
        card.stats = [
            Stat("outbounds", number(len(rows))),
            Stat("left", number(left), "busy" if left else ""),
            Stat("success", number(sum(r.success for r in rows)), "good"),
            Stat("failed", number(failed), "bad" if failed else ""),
            Stat("dispatched", per_second(sum(r.rate for r in rows))),
        ]
        if down:
            card.stats.append(Stat("out of reach", number(down), "bad"))
    return card


AREA = Area("queues", "Queues", "/ui/queues", summary)

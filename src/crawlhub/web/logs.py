"""``/ui/logs``: search the log store (words, job, run, task, lowest level, source, since),
100 lines a page read in time order with "older" / "newer" links (keyset on the line ids),
and a live tail of the same filters over ``GET /logs/tail`` (Server-Sent Events)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep, control_plane
from crawlhub.control.logs import LEVELS, SOURCES, LogLine, LogQuery, LogQueryError, parse_when
from crawlhub.services import Services
from crawlhub.web.paging import Page, number_param, text_param
from crawlhub.web.render import Area, attempt, page

router = routing.router()
STORE = "the log store (control.logs_url)"
LINES_PAGE = 100
#: The filters a search and its tail share (``since`` is the search's alone).
FILTERS = ("job", "run", "task", "level", "source", "q")


def _cursor(request: Request, name: str) -> int | None:
    value = number_param(request, name, 0, low=0, high=2**62)
    return value or None


async def _search(svc: Services, query: LogQuery, follow: bool
                  ) -> tuple[Page[LogLine], int, float]:
    """The page of ``query`` in time order (oldest line first): ``prev`` is the
    ``before`` of the older page, ``next`` the ``after`` of the newer one; the store's
    last id (a tail starts after it); the seconds the search took."""
    logs = control_plane(svc).logs
    last = 0
    if follow:  # the newest page, and a tail from exactly where it ends
        last = await logs.store.last_id()
        query = replace(query, before=last + 1)
    started = time.perf_counter()
    found = await logs.search(query)
    took = time.perf_counter() - started
    lines = found.lines
    older: str | None
    if query.after is not None:  # read forward: oldest first already
        older = str(lines[0].id) if lines else str(query.after + 1)
        newer = str(found.next) if found.next is not None else None
    else:  # newest first: shown the other way round
        lines = list(reversed(lines))
        older = str(found.next) if found.next is not None else None
        newer = str(lines[-1].id) if lines and query.before is not None and not follow \
            else None
    return Page(rows=lines, prev=older, next=newer), last, took


async def _data(request: Request, svc: Services) -> dict[str, Any]:
    given = {name: text_param(request, name, 1000 if name == "q" else 200)
             for name in (*FILTERS, "since")}
    before, after = _cursor(request, "before"), _cursor(request, "after")
    follow = request.query_params.get("tail") == "1" and before is None and after is None
    limit = number_param(request, "limit", LINES_PAGE, high=1000)
    data: dict[str, Any] = {"given": {k: v or "" for k, v in given.items()},
                            "levels": LEVELS, "sources": SOURCES, "lines": Page(),
                            "error": None, "tail": None, "took": None, "follow": follow,
                            "paged": before is not None or after is not None}
    try:
        query = LogQuery(job=given["job"], run=given["run"], task=given["task"],
                         level=given["level"], source=given["source"], q=given["q"],
                         since=parse_when(given["since"], name="since"), before=before,
                         after=after, limit=limit)
    except LogQueryError as exc:
        data["error"] = str(exc)
        return data
    found, data["error"] = await attempt(_search(svc, query, follow), STORE)
    if found is not None:
        data["lines"], last, data["took"] = found
        if follow:
            shared = {k: given[k] for k in FILTERS if given[k]}
            data["tail"] = "/logs/tail?" + urlencode({**shared, "after": last})
    return data


@router.get("/ui/logs")
async def logs_page(request: Request, svc: ServicesDep) -> HTMLResponse:
    return page(request, "logs.html", area="logs", title="Logs", **await _data(request, svc))


AREA = Area("logs", "Logs", "/ui/logs")

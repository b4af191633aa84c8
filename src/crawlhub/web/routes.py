"""The web page's router: the login and every page, in the nav's order."""

from __future__ import annotations

from fastapi import APIRouter

try:
    from crawlhub.web import (
        agents,
        alerts,
        frontier,
        jobs,
        login,
        logs,
        overview,
        projects,
        queues,
        runs,
        trends,
    )
except ImportError as exc:
    # the app mounts this router only if it imports, and would quietly serve no web page
    # at all: say what is missing instead
    raise RuntimeError(f"the web page does not import: {exc}") from exc
from crawlhub.web.render import set_areas

#: The pages, in the nav's order; each has ``router`` and ``AREA``.
PAGES = (overview, agents, queues, frontier, projects, jobs, runs, logs, alerts)

router = APIRouter(include_in_schema=False)
router.include_router(login.router, include_in_schema=False)
for _page in PAGES:
    router.include_router(_page.router, include_in_schema=False)
router.include_router(trends.router, include_in_schema=False)  # the pages' charts
set_areas([_page.AREA for _page in PAGES])

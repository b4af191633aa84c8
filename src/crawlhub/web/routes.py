"""The web page's routers: the login, every page in the nav's order, the charts."""

from __future__ import annotations

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

#: The routers the app mounts, each on its own (out of the OpenAPI document): not one
#: router of routers, which FastAPI would build whole on the include (crawlhub.api.routing).
ROUTERS = (login.router, *(_page.router for _page in PAGES), trends.router)  # trends: the charts
set_areas([_page.AREA for _page in PAGES])

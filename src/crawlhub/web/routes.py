"""The web page's router: the login, and every page module present, in the nav's order
(a page of another part appears once its module exists; none is faked meanwhile)."""

from __future__ import annotations

import importlib

from fastapi import APIRouter

from crawlhub.web import login
from crawlhub.web.render import Area, set_areas

#: Page modules, in the nav's order; each has ``router`` and ``AREA``.
PAGES = ("crawlhub.web.overview", "crawlhub.web.agents", "crawlhub.web.queues",
         "crawlhub.web.frontier", "crawlhub.web.projects", "crawlhub.web.jobs",
         "crawlhub.web.runs", "crawlhub.web.logs", "crawlhub.web.alerts")

router = APIRouter(include_in_schema=False)
router.include_router(login.router, include_in_schema=False)


def _mount() -> None:
    found: list[Area] = []
    for name in PAGES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                # the page is there but something it needs is not: say so loudly (the
                # app skips an optional router on ImportError, which would hide the
                # whole web page)
                raise RuntimeError(f"the web page module {name} does not import: {exc}"
                                   ) from exc
            continue
        router.include_router(module.router, include_in_schema=False)
        found.append(module.AREA)
    set_areas(found)


_mount()

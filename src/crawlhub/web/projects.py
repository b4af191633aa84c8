"""``/ui/projects``: projects (git URL, default branch, release tag pattern, whether a
password and a webhook secret are stored - never either) with a "build" form on the JSON
API, and the builds newest first (status, version, tag, artifact, times, log folded),
filtered by project and refreshed every 2 s."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep, control_plane
from crawlhub.control.builds import Build
from crawlhub.control.projects import NAME_RE, Project
from crawlhub.core.redact import redact_url
from crawlhub.services import Services
from crawlhub.web.paging import Page, forward, number_param, text_param
from crawlhub.web.render import Area, Card, Stat, attempt, fragment, number, page

router = routing.router()
STORE = "the project store (control.url)"
PROJECTS_PAGE = 50
BUILDS_PAGE = 50


async def _projects(svc: Services, after: str | None, limit: int) -> Page[Project]:
    found = await control_plane(svc).projects.list(limit=limit + 1, after=after)
    for project in found:  # a URL never holds a password (refused when added); belt on
        project.git_url = redact_url(project.git_url)
    return forward(found, limit, lambda p: p.name, started=bool(after))


async def _builds(svc: Services, project: str | None, before: int | None,
                  limit: int) -> Page[Build]:
    found = await control_plane(svc).builds.list(project=project, before=before, limit=limit + 1)
    return forward(found, limit, lambda b: str(b.id), started=before is not None)


def _project_filter(request: Request) -> str | None:
    name = text_param(request, "project", 64)
    return name if name and NAME_RE.match(name) else None


async def _builds_data(request: Request, svc: Services) -> dict[str, Any]:
    project = _project_filter(request)
    before = number_param(request, "b_before", 0, low=0, high=2**62) or None
    builds, error = await attempt(
        _builds(svc, project, before, number_param(request, "limit", BUILDS_PAGE)), STORE)
    return {"builds": builds or Page(), "builds_error": error, "project": project or ""}


@router.get("/ui/projects")
async def projects_page(request: Request, svc: ServicesDep) -> HTMLResponse:
    projects, error = await attempt(
        _projects(svc, text_param(request, "after", 64),
                  number_param(request, "limit", PROJECTS_PAGE)), STORE)
    return page(request, "projects.html", area="projects", title="Projects",
                projects=projects or Page(), error=error, **await _builds_data(request, svc))


@router.get("/ui/projects/live")
async def builds_live(request: Request, svc: ServicesDep) -> HTMLResponse:
    """The builds block (the projects table above it holds forms: it is not swapped)."""
    return fragment(request, "builds_live.html", area="projects",
                    **await _builds_data(request, svc))


@router.get("/ui/build/{build_id}/log")
async def build_log(request: Request, svc: ServicesDep, build_id: int) -> HTMLResponse:
    """A build's log for its folded section, escaped in a ``<pre>`` (htmx inserts HTML:
    the text of ``GET /builds/{id}/log`` would be parsed as markup)."""
    text, error = await attempt(control_plane(svc).builds.log_text(build_id), STORE)
    return fragment(request, "build_log.html", area="projects", text=text, error=error)


async def summary(svc: Services) -> Card:
    card = Card("Projects and builds", AREA.path)

    async def figures() -> tuple[int, list[Build]]:
        control = control_plane(svc)
        return await control.projects.count(), await control.builds.list(limit=20)

    found, card.error = await attempt(figures(), STORE)
    if found is not None:
        count, newest = found
        building = sum(1 for b in newest if b.status in ("queued", "running"))
        failed = sum(1 for b in newest if b.status == "failed")
        card.stats = [Stat("projects", number(count)),
                      Stat("building", number(building), "busy" if building else ""),
                      Stat("failed", number(failed), "bad" if failed else "")]
        if newest:
            card.note = "builds: of the newest 20"
    return card


AREA = Area("projects", "Projects", "/ui/projects", summary)

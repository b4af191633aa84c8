"""``/ui/jobs``: every job (100 a page, by name; filtered by name prefix and kind) with its
cron, next tick, state and last run, and run / pause / continue / restart / cancel
buttons on the JSON API; ``/ui/job/{name}``: one job's spec, notes, queue figures and
runs (``/ui/job/...``, singular: a job may be called ``live``). Both refresh every 2 s.

The jobs page's form makes a job as seed 001 says: name, cron, **image choice**, command
and notes. The choice offers the images the ``image`` builder made (project + version:
the job runs in that image with ``runtime: container``), a plain image reference, or
none (the server's default runtime); ``POST /ui/jobs/new`` turns it into a JobSpec."""

from __future__ import annotations

import shlex
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field, ValidationError

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep, control_plane
from crawlhub.api.jobs import JobRow, row
from crawlhub.control.jobs import JobSpec, JobView, QueueInfo, RunRecord
from crawlhub.control.jobs.model import KINDS
from crawlhub.core.errors import NotFoundError
from crawlhub.services import Services
from crawlhub.web.paging import Page, forward, number_param, text_param
from crawlhub.web.render import (
    Area,
    Card,
    Stat,
    attempt,
    fragment,
    live_page,
    not_found,
    number,
    page,
)

router = routing.router()
STORE = "the job store (control.url)"
#: Jobs per page (the issue's "1,000 jobs": ten pages, each one indexed read).
JOBS_PAGE = 100
RUNS_PAGE = 50


async def _jobs(svc: Services, after: str | None, prefix: str | None, kind: str | None,
                limit: int) -> Page[JobRow]:
    # limit + 1: the extra job says there is a next page. Cost: one indexed read of the
    # page, two for the runs of the jobs shown and one for the desired states, whatever
    # the page size (JobService._views).
    views = await control_plane(svc).jobs.list_jobs(after=after, limit=limit + 1, kind=kind,
                                            prefix=prefix)
    return forward([row(v) for v in views], limit, lambda j: j.name, started=bool(after))


async def _list_data(request: Request, svc: Services) -> dict[str, Any]:
    kind = text_param(request, "kind")
    kind = kind if kind in KINDS else None
    prefix = text_param(request, "prefix", 64)
    jobs, error = await attempt(
        _jobs(svc, text_param(request, "after"), prefix, kind,
              number_param(request, "limit", JOBS_PAGE)), STORE)
    images, _ = await attempt(built_images(svc), STORE)
    return {"jobs": jobs or Page(), "error": error, "prefix": prefix or "", "kind": kind or "",
            "kinds": KINDS, "images": images or []}


live_page(router, "/ui/jobs", "jobs", area="jobs", title="Jobs", data=_list_data)

#: Built images the job form offers (the newest first).
IMAGES_OFFERED = 100


async def built_images(svc: Services) -> list[tuple[str, str]]:
    """(value, label) of the images the ``image`` builder made: ``build:project:version``
    -> ``crawlhub/project:version``, newest first, one per project and version."""
    builds = await control_plane(svc).builds.list(status="succeeded", limit=IMAGES_OFFERED)
    seen: dict[str, str] = {}
    for build in builds:
        if build.artifact_kind == "image" and build.artifact_path:
            seen.setdefault(f"build:{build.project}:{build.version}", build.artifact_path)
    return list(seen.items())


class NewJobForm(BaseModel):
    """The jobs page's form, as its fields send it (strings)."""

    name: str = Field(max_length=64)
    command: str = Field(max_length=100_000)
    cron: str = Field("", max_length=200)
    #: "" (no image: the server's runtime), "build:<project>:<version>", or an image reference
    image: str = Field("", max_length=300)
    notes: str = Field("", max_length=10_000)


@router.post("/ui/jobs/new", status_code=201)
async def new_job(form: NewJobForm, svc: ServicesDep) -> JobRow:
    """Make the form's job: its command is split like a shell line (never run by one)."""
    try:
        argv = shlex.split(form.command)
    except ValueError as exc:
        raise RequestValidationError([{"loc": ["body", "command"], "type": "value_error",
                                       "msg": f"{exc}: quote it like a shell line"}]) from None
    fields: dict[str, Any] = {"name": form.name, "command": argv,
                              "cron": form.cron or None, "notes": form.notes}
    if form.image.startswith("build:"):
        project, _, version = form.image[len("build:"):].partition(":")
        fields.update(runtime="container", project=project, version=version or None)
    elif form.image:
        fields.update(runtime="container", image=form.image)
    try:
        spec = JobSpec.model_validate(fields)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    view = await control_plane(svc).jobs.create(spec)
    return row(view)


# ---------------------------------------------------------------------------- one job
async def _job(svc: Services, name: str, before: str | None
               ) -> tuple[JobView, QueueInfo, Page[RunRecord]]:
    jobs = control_plane(svc).jobs
    view = await jobs.get(name)
    runs = await jobs.runs(job=name, before=before, limit=RUNS_PAGE + 1)
    return (view, await jobs.queue(name),
            forward(runs, RUNS_PAGE, lambda r: r.id, started=bool(before)))


async def _job_data(request: Request, svc: Services, name: str) -> dict[str, Any] | None:
    try:
        found, error = await attempt(_job(svc, name, text_param(request, "run_before")),
                                     STORE)
    except NotFoundError:
        return None
    data: dict[str, Any] = {"name": name, "error": error, "job": None, "spec": None,
                            "queue": QueueInfo(), "runs": Page(), "argv": ""}
    if found is not None:
        view, queue, runs = found
        data.update(job=row(view), spec=view.spec, queue=queue, runs=runs,
                    argv=shlex.join(view.spec.argv()))
    return data


@router.get("/ui/job/{name}")
async def job_page(request: Request, svc: ServicesDep, name: str) -> HTMLResponse:
    data = await _job_data(request, svc, name)
    if data is None:
        return not_found(request, area="jobs", title="No such job",
                         message=f"There is no job named {name!r}.")
    return page(request, "job.html", area="jobs", title=f"Job {name}", **data)


@router.get("/ui/job/{name}/live")
async def job_live(request: Request, svc: ServicesDep, name: str) -> HTMLResponse:
    data = await _job_data(request, svc, name)
    if data is None:
        # htmx keeps the page and says so in the bar (a job removed meanwhile)
        raise NotFoundError(f"no job named {name!r} (removed?)")
    return fragment(request, "job_live.html", area="jobs", **data)


# ---------------------------------------------------------------------------- overview
async def summary(svc: Services) -> Card:
    card = Card("Jobs", AREA.path)

    async def figures() -> tuple[int, int]:
        jobs = control_plane(svc).jobs
        return await jobs.store.count(), len(await jobs.store.live_runs())

    found, card.error = await attempt(figures(), STORE)
    if found is not None:
        count, running = found
        card.stats = [Stat("jobs", number(count)),
                      Stat("running", number(running), "busy" if running else "")]
    return card


AREA = Area("jobs", "Jobs", "/ui/jobs", summary)

"""``/ui/runs``: every job's runs, newest first (filtered by job and status), 50 a page;
``/ui/run/{id}``: one run - status, exit code, start/end, counters and queue figures, the
timeline of its tasks (each folds open onto its log lines, read when opened), and the
run's log, followed live while the run goes on."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep, control_plane
from crawlhub.control.jobs import RunRecord, RunView
from crawlhub.control.jobs.model import FINAL, LIVE
from crawlhub.control.logs import LogLine, LogQuery
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
STORE = "the run history (control.url)"
LOGS = "the log store (control.logs_url)"
RUNS_PAGE = 50
#: Timeline rows shown (a run of thousands of tasks shows its first ones and says so).
MAX_TASKS = 500
#: Log lines shown on a run's page and in a task's section (older ones: the logs page).
LOG_LINES = 500
#: Counters shown in a run's header.
MAX_COUNTERS = 40
#: Scrapy's final stats a Scrapy run's page shows first, as ScrapydWeb does (the
#: extension, ``crawlhub.contrib.scrapy.extension``, reports them as the run's counters).
SCRAPY_STATS = ("finish_reason", "elapsed_time_seconds", "item_scraped_count",
                "item_dropped_count", "downloader/request_count", "response_received_count",
                "log_count/ERROR", "log_count/WARNING", "retry/count")
#: Counters that say a run is a Scrapy crawl's.
_SCRAPY_MARKS = ("finish_reason", "elapsed_time_seconds", "item_scraped_count",
                 "downloader/request_count")
_STATUS = "downloader/response_status_count/"


def scrapy_stats(counters: dict[str, Any]) -> dict[str, Any] | None:
    """A Scrapy run's final stats: the named ones (:data:`SCRAPY_STATS`) that it has, and
    its responses per HTTP status; None for a run that is not a Scrapy crawl's."""
    if not any(key in counters for key in _SCRAPY_MARKS):
        return None
    statuses = sorted((key[len(_STATUS):], value) for key, value in counters.items()
                      if key.startswith(_STATUS))
    return {"stats": [(key, counters[key]) for key in SCRAPY_STATS if key in counters],
            "statuses": statuses}


# ---------------------------------------------------------------------------- the list
async def _runs(svc: Services, job: str | None, status: str | None, before: str | None,
                limit: int) -> Page[RunRecord]:
    # one indexed read: (job, id) or (status, id), newest first, limit + 1 rows
    runs = await control_plane(svc).jobs.runs(job=job, status=[status] if status else None,
                                      before=before, limit=limit + 1)
    return forward(runs, limit, lambda r: r.id, started=bool(before))


async def _list_data(request: Request, svc: Services) -> dict[str, Any]:
    job = text_param(request, "job", 100)
    status = text_param(request, "status", 20)
    status = status if status in LIVE + FINAL else None
    runs, error = await attempt(
        _runs(svc, job, status, text_param(request, "before", 64),
              number_param(request, "limit", RUNS_PAGE)), STORE)
    return {"runs": runs or Page(), "error": error, "job": job or "", "run_status": status or "",
            "statuses": LIVE + FINAL}


live_page(router, "/ui/runs", "runs", area="runs", title="Runs", data=_list_data)


# ---------------------------------------------------------------------------- one run
def task_id(task: str) -> str:
    """An HTML id for a task code (codes may hold any character)."""
    return hashlib.blake2s(task.encode("utf-8", "replace"), digest_size=6).hexdigest()


def _timeline(view: RunView) -> list[dict[str, Any]]:
    return [{"label": t.task, "task": t.task, "start": t.started_at, "end": t.finished_at,
             "status": t.status, "id": task_id(t.task), "detail": t.detail}
            for t in view.tasks[:MAX_TASKS]]


async def _run_data(svc: Services, run_id: str) -> dict[str, Any] | None:
    try:
        view, error = await attempt(control_plane(svc).jobs.run_view(run_id), STORE)
    except NotFoundError:
        return None
    data: dict[str, Any] = {"run_id": run_id, "error": error, "run": None, "tasks": [],
                            "more_tasks": 0, "counters": [], "queue": None, "going": False,
                            "scrapy": None}
    if view is not None:
        run = view.run
        data.update(run=run, tasks=_timeline(view), queue=view.queue,
                    more_tasks=max(len(view.tasks) - MAX_TASKS, 0),
                    counters=sorted(run.counters.items())[:MAX_COUNTERS],
                    going=run.status in LIVE, scrapy=scrapy_stats(run.counters))
    return data


async def _lines(svc: Services, query: LogQuery) -> tuple[list[LogLine], int, int | None]:
    """The newest lines of ``query`` oldest first, the store's last id when read (a tail
    starts after it: nothing written meanwhile is missed), and the ``before`` that shows
    older ones (None: there are none)."""
    logs = control_plane(svc).logs
    last = await logs.store.last_id()
    found = await logs.search(replace(query, before=last + 1))
    return list(reversed(found.lines)), last, found.next


@router.get("/ui/run/{run_id}")
async def run_page(request: Request, svc: ServicesDep, run_id: str) -> HTMLResponse:
    data = await _run_data(svc, run_id)
    if data is None:
        return not_found(request, area="runs", title="No such run",
                         message=f"There is no run {run_id!r}.")
    lines, log_error = await attempt(_lines(svc, LogQuery(run=run_id, limit=LOG_LINES)),
                                     LOGS)
    shown, last, older = lines or ([], 0, None)
    return page(request, "run.html", area="runs", title=f"Run {run_id}", lines=shown,
                last_id=last, older=older, log_error=log_error, **data)


@router.get("/ui/run/{run_id}/live")
async def run_live(request: Request, svc: ServicesDep, run_id: str) -> HTMLResponse:
    data = await _run_data(svc, run_id)
    if data is None:
        raise NotFoundError(f"no run {run_id!r}")
    return fragment(request, "run_live.html", area="runs", **data)


@router.get("/ui/run/{run_id}/log")
async def run_task_log(request: Request, svc: ServicesDep, run_id: str) -> HTMLResponse:
    """A task's lines (``?task=``), or the run's: what a timeline row folds open onto."""
    task = text_param(request, "task", 200)
    limit = number_param(request, "limit", LOG_LINES, high=2000)
    lines, error = await attempt(_lines(svc, LogQuery(run=run_id, task=task, limit=limit)),
                                 LOGS)
    shown, _, older = lines or ([], 0, None)
    return fragment(request, "run_task_log.html", area="runs", run_id=run_id, task=task,
                    view_id=f"log-{task_id(task or '')}", lines=shown, older=older,
                    error=error)


# ---------------------------------------------------------------------------- overview
async def summary(svc: Services) -> Card:
    card = Card("Runs", AREA.path)

    async def figures() -> tuple[int, list[RunRecord]]:
        jobs = control_plane(svc).jobs
        return len(await jobs.store.live_runs()), await jobs.runs(limit=100)

    found, card.error = await attempt(figures(), STORE)
    if found is not None:
        running, newest = found
        failed = sum(1 for r in newest if r.status in ("failed", "timeout", "lost"))
        card.stats = [Stat("running", number(running), "busy" if running else ""),
                      Stat("succeeded", number(sum(1 for r in newest
                                                   if r.status == "succeeded")), "good"),
                      Stat("failed", number(failed), "bad" if failed else "")]
        card.note = "of the newest 100 runs" if newest else "no run yet"
    return card


AREA = Area("runs", "Runs", "/ui/runs", summary)

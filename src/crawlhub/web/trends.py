"""The charts of the web page, drawn from the per-minute series in the control store
(:mod:`crawlhub.control.series`, sampled by :mod:`crawlhub.control.sampler`):

- a run's page: its pages, items and errors per minute (and Scrapy's final stats, in
  ``runs.py``);
- a job's page: its pages, items and errors per minute across its last runs, and a
  table and a chart comparing those runs;
- the queues page: each outbound's queue depth and dispatch rate over the last hour;
- the agents page: each live agent's QPS and memory over the last hour;
- the frontier page: admitted and duplicate seeds per segment, and per minute over the
  last hour.

Each page loads its charts block from ``/ui/charts/...`` once shown and again every
:data:`EVERY` (figures change by the minute, not at every 2 s poll of the page).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep, control_plane
from crawlhub.control.jobs import RunRecord
from crawlhub.control.jobs.model import LIVE
from crawlhub.control.sampler import run_figures
from crawlhub.control.series import MINUTE, Point, Series, SeriesStore, increases, minute_of
from crawlhub.core.errors import NotFoundError
from crawlhub.services import Services
from crawlhub.web.charts import Line, bar_chart, line_chart
from crawlhub.web.paging import text_param
from crawlhub.web.render import attempt, fragment, size

router = routing.router()
STORE = "the charts' series (control.url)"
#: How often a charts block is drawn again.
EVERY = "15s"
#: The window of the queues, agents and frontier charts.
HOUR = 3600
#: Series drawn on one chart at most (the busiest; the chart says which are left out).
MAX_LINES = 8
#: Runs a job's page compares.
COMPARE_RUNS = 10
RUN_METRICS = ("pages", "items", "errors")


def _store(svc: Services) -> SeriesStore:
    if svc.series is None:
        control_plane(svc)  # says the control plane is not open
        raise NotFoundError("the charts' store is not open on this server")
    return svc.series


def _busiest(series: Series, metric: str, limit: int = MAX_LINES) -> tuple[list[str], int]:
    """The subjects with the highest peak of ``metric`` (then by name), and how many
    subjects there are."""
    peaks = {subject: max(p.mean for p in points)
             for (subject, m), points in series.items() if m == metric}
    ranked = sorted(peaks, key=lambda s: (-peaks[s], s))
    return ranked[:limit], len(ranked)


def _left_out(shown: int, total: int, what: str) -> str:
    return f"the {shown} busiest of {total} {what}" if total > shown else ""


def _gauge_lines(series: Series, subjects: Sequence[str], metric: str) -> list[Line]:
    return [Line(s, [(p.ts, round(p.mean, 3)) for p in series.get((s, metric), [])])
            for s in subjects]


# ---------------------------------------------------------------------------- runs
def run_lines(points: dict[str, list[Point]], run: RunRecord,
              now: float) -> dict[str, list[tuple[int, float]]]:
    """A run's pages, items and errors per minute: the increase of each counter from
    minute to minute, from 0 at its start. A run whose end came after the last sample
    (or too soon for one) gets its final counters as the last minute's."""
    final = run_figures(run)
    out = {}
    for metric in RUN_METRICS:
        found = points.get(metric, [])
        if run.status not in LIVE and metric in final and (
                not found or found[-1].latest != final[metric]):
            at = minute_of(run.finished_at or now)
            kept = [p for p in found if p.ts < at]
            found = [*kept, Point(at, final[metric], final[metric], 1)]
        out[metric] = increases(found, start=run.started_at)
    return out


async def _run_points(store: SeriesStore, runs: Sequence[RunRecord], since: float
                      ) -> dict[str, dict[str, list[Point]]]:
    series = await store.read("run", since=since, subjects=[r.id for r in runs],
                              metrics=list(RUN_METRICS))
    by_run: dict[str, dict[str, list[Point]]] = defaultdict(dict)
    for (subject, metric), points in series.items():
        by_run[subject][metric] = points
    return by_run


def _window(runs: Sequence[RunRecord], now: float) -> tuple[float, float]:
    start = min(r.started_at for r in runs)
    end = max((r.finished_at or now) if r.status not in LIVE else now for r in runs)
    return minute_of(start), minute_of(end) + MINUTE


async def run_charts(svc: Services, run: RunRecord, now: float) -> dict[str, Any]:
    store = _store(svc)
    points = (await _run_points(store, [run], run.started_at - MINUTE)).get(run.id, {})
    lines = run_lines(points, run, now)
    start, end = _window([run], now)
    chart = line_chart("run", "Pages, items and errors per minute",
                       [Line(m, [(float(ts), v) for ts, v in lines[m]]) for m in RUN_METRICS],
                       start=start, end=end)
    return {"charts": [chart]}


async def job_charts(svc: Services, name: str, now: float) -> dict[str, Any]:
    """The job's last :data:`COMPARE_RUNS` runs: per minute across them, and compared."""
    store = _store(svc)
    runs = [r for r in await control_plane(svc).jobs.runs(job=name, limit=COMPARE_RUNS)
            if r.status != "skipped"]
    if not runs:
        return {"charts": [], "compare": []}
    start, end = _window(runs, now)
    by_run = await _run_points(store, runs, start - MINUTE)
    total: dict[str, dict[int, float]] = {m: defaultdict(float) for m in RUN_METRICS}
    compare = []
    for run in runs:
        lines = run_lines(by_run.get(run.id, {}), run, now)
        for metric in RUN_METRICS:
            for ts, value in lines[metric]:
                total[metric][ts] += value
        figures = run_figures(run)
        compare.append({"run": run, "pages": figures.get("pages"),
                        "items": figures.get("items"), "errors": figures.get("errors"),
                        "finish_reason": run.counters.get("finish_reason"),
                        "duration": (run.finished_at or now) - run.started_at})
    per_minute = line_chart(
        "job", f"Pages, items and errors per minute, last {len(runs)} runs",
        [Line(m, sorted((float(ts), v) for ts, v in total[m].items())) for m in RUN_METRICS],
        start=start, end=end)
    oldest_first = list(reversed(compare))
    runs_bars = bar_chart(
        "job-runs", "Pages, items and errors per run (oldest left)",
        [row["run"].id[-8:] for row in oldest_first],
        [(m, [float(row[m] or 0) for row in oldest_first]) for m in RUN_METRICS])
    return {"charts": [per_minute, runs_bars], "compare": compare}


# ---------------------------------------------------------------------------- the rest
async def queue_charts(svc: Services, now: float) -> dict[str, Any]:
    series = await _store(svc).read("outbound", since=now - HOUR, until=now)
    shown, total = _busiest(series, "depth")
    rates, _ = _busiest(series, "rate")
    note = _left_out(len(shown), total, "outbounds")
    return {"charts": [
        line_chart("outbound-depth", "Queue depth per outbound, last hour (mean a minute)",
                   _gauge_lines(series, shown, "depth"), start=now - HOUR, end=now,
                   note=note),
        line_chart("outbound-rate", "Dispatched per second per outbound, last hour",
                   _gauge_lines(series, rates, "rate"), start=now - HOUR, end=now,
                   unit="/s", note=_left_out(len(rates), total, "outbounds")),
    ]}


def _bytes(value: float) -> str:
    return size(int(value))


async def agent_charts(svc: Services, now: float) -> dict[str, Any]:
    series = await _store(svc).read("agent", since=now - HOUR, until=now)
    qps, total = _busiest(series, "qps")
    memory, _ = _busiest(series, "memory")
    return {"charts": [
        line_chart("agent-qps", "Requests per second per agent, last hour",
                   _gauge_lines(series, qps, "qps"), start=now - HOUR, end=now,
                   unit="/s", note=_left_out(len(qps), total, "agents")),
        line_chart("agent-memory", "Resident memory per agent, last hour",
                   _gauge_lines(series, memory, "memory"), start=now - HOUR, end=now,
                   fmt=_bytes, note=_left_out(len(memory), total, "agents")),
    ]}


async def frontier_charts(svc: Services, name: str | None, now: float) -> dict[str, Any]:
    """The chosen frontier's (default: the first) seeds per segment, from the frontier
    itself, and per minute over the last hour, from the series."""
    if not svc.frontiers:
        return {"charts": []}
    name = name if name in svc.frontiers else sorted(svc.frontiers)[0]
    described = await svc.frontier(name).describe()
    segments = sorted(described["segments"], key=lambda s: s["segment"])[-12:]
    labels = [str(s.get("label") or s["segment"]) for s in segments]
    per_segment = bar_chart(
        "frontier-segments", f"Seeds admitted and duplicate per segment: {name}", labels,
        [(m, [float(s[m]) for s in segments]) for m in ("admitted", "duplicates")])
    series = await _store(svc).read("frontier", since=now - HOUR - MINUTE, until=now,
                                    subjects=[name])
    total: dict[str, dict[int, float]] = {"admitted": defaultdict(float),
                                          "duplicates": defaultdict(float)}
    for (_, metric), points in series.items():
        kind = metric.split("@", 1)[0]
        if kind in total:
            for ts, value in increases(points):
                total[kind][ts] += value
    per_minute = line_chart(
        "frontier-minutes", f"Seeds admitted and duplicate per minute, last hour: {name}",
        [Line(kind, sorted((float(ts), v) for ts, v in values.items()))
         for kind, values in total.items()], start=now - HOUR, end=now)
    return {"charts": [per_segment, per_minute], "frontier": name}


# ---------------------------------------------------------------------------- routes
async def _block(request: Request, load: Awaitable[dict[str, Any]]) -> HTMLResponse:
    """A charts block: its charts, or why they could not be read (the store away)."""
    found, error = await attempt(load, STORE)
    return fragment(request, "charts_block.html", charts_error=error,
                    **(found or {"charts": []}))


@router.get("/ui/charts/run/{run_id}")
async def run_block(request: Request, svc: ServicesDep, run_id: str) -> HTMLResponse:
    run = await control_plane(svc).jobs.store.run(run_id)  # NotFoundError: a 404
    return await _block(request, run_charts(svc, run, time.time()))


@router.get("/ui/charts/job/{name}")
async def job_block(request: Request, svc: ServicesDep, name: str) -> HTMLResponse:
    await control_plane(svc).jobs.spec(name)
    return await _block(request, job_charts(svc, name, time.time()))


@router.get("/ui/charts/queues")
async def queues_block(request: Request, svc: ServicesDep) -> HTMLResponse:
    return await _block(request, queue_charts(svc, time.time()))


@router.get("/ui/charts/agents")
async def agents_block(request: Request, svc: ServicesDep) -> HTMLResponse:
    return await _block(request, agent_charts(svc, time.time()))


@router.get("/ui/charts/frontier")
async def frontier_block(request: Request, svc: ServicesDep) -> HTMLResponse:
    return await _block(request, frontier_charts(svc, text_param(request, "name", 200),
                                                 time.time()))

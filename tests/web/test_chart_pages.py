"""The charts in headless Chromium, on a server of this module's own (the harness's
config, its own data directory) whose sampler the test drives: tasks in the outbound,
seeds admitted and refused by the frontier, an agent with a hostile id, a job counting
items run twice and a Scrapy spider run as a job against a local site. Each chart shows
the store's figures, point for point; the Scrapy run's page shows Scrapy's final stats
and the job's page compares its runs; after a restart on the same data directory every
chart shows the same points.

Screenshots: ``charts-*.png`` in the harness's artifacts directory."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from crawlhub.control.series import MINUTE, Sample
from tests.agents.servers import Site

from .conftest import (
    HOSTILE_AGENT,
    Server,
    Watch,
    _page,
    _shots,
    artifacts_dir,
    login,
    running_server,
)

ROOT = Path(__file__).resolve().parents[2]
ITEM_JOB = ROOT / "tests" / "control" / "item_job.py"
SPIDER = Path(__file__).with_name("stats_spider.py")
EXTENSION = "crawlhub.contrib.scrapy.extension.CrawlhubControl"
PAGES = ("/ui/queues", "/ui/agents", "/ui/frontier")
#: Every chart's points: chart -> sorted (series, x, value) triples.
Snapshot = dict[str, list[tuple[str, str, float]]]
SNAPSHOT_JS = """figs => figs.map(f => [f.dataset.chart, f.dataset.count,
  [...f.querySelectorAll('circle, rect.bar')].map(e => [
     (e.closest('g[data-series]') || e).dataset.series,
     e.dataset.category || e.dataset.ts, Number(e.dataset.value)])])"""


class SiteThread:
    """The test site (``tests.agents.servers.Site``) in a loop of its own: it outlives
    the crawlhub servers the module starts and stops."""

    def __init__(self, pages: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.site = Site(pages=pages)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Site:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.site.start(), self.loop).result(10)
        return self.site

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.site.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Charted:
    """The module's server: started, restarted on the same data directory, sampled by
    hand (its own sampler loop is stopped, so nothing is sampled behind the test)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.stack = ExitStack()
        self.server = self.start()
        self.runs: dict[str, str] = {}

    def start(self) -> Server:
        srv = self.stack.enter_context(running_server(self.data_dir))
        srv.run(srv.services.sampler.close())
        services = srv.services
        # the server's own sources, sampled when the test says
        self.sampler = type(services.sampler)(services.series, services.sampler.sources)
        return srv

    def restart(self) -> None:
        self.stack.close()
        self.stack = ExitStack()
        self.server = self.start()

    def tick(self) -> int:
        return int(self.server.run(self.sampler.tick()))

    def read(self, scope: str, **kwargs: Any) -> Any:
        return self.server.run(self.server.services.series.read(scope, **kwargs))


def wait_run(srv: Server, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = get_run(srv, run_id)
        if run["status"] not in ("queued", "running"):
            return run  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not end")


def get_run(srv: Server, run_id: str) -> dict[str, Any]:
    status, view = srv.api("GET", f"/runs/{run_id}")
    assert status == 200, view
    return view["run"]  # type: ignore[no-any-return]


def start_run(srv: Server, job: str) -> str:
    status, answer = srv.api("POST", f"/jobs/{job}/run")
    assert status == 202, answer
    return str(answer["run_id"])


@pytest.fixture(scope="module")
def charted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Charted]:
    with SiteThread(pages=20) as site:
        world = Charted(tmp_path_factory.mktemp("charts"))
        try:
            _fill(world, site)
            yield world
        finally:
            world.stack.close()


def _fill(world: Charted, site: Site) -> None:
    """Real figures in every source, sampled by hand; four earlier minutes of the
    outbound and the agent written to the store as the sampler would have."""
    from .conftest import _seed, beat_hostile

    srv = world.server
    srv.run(_seed(srv.app))  # the hostile agent, heartbeat: 4.5 QPS, 50 MiB
    status, answer = srv.api("POST", "/task/", [{"url": f"http://127.0.0.1/c/{i}"}
                                                 for i in range(5)])
    assert status == 200, answer
    status, answer = srv.api("POST", "/task/", [{"url": "http://127.0.0.1/c/0"},
                                                 {"url": "http://127.0.0.1/c/1"}])
    assert status == 200, answer
    now = time.time()
    history = [Sample("outbound", "default", "depth", 10.0 * k) for k in (1, 2, 3, 4)]
    for k, sample in enumerate(history, start=1):
        srv.run(srv.services.series.record(
            [sample, Sample("outbound", "default", "rate", 0.5 * k),
             Sample("agent", HOSTILE_AGENT, "qps", float(k)),
             Sample("agent", HOSTILE_AGENT, "memory", float(k * 2**20))],
            at=now - (5 - k) * MINUTE))
    # the frontier's segment two minutes ago: 2 admitted, no duplicate yet
    segment = srv.run(srv.services.frontier("news").describe())["current_segment"]
    srv.run(srv.services.series.record(
        [Sample("frontier", "news", f"admitted@{segment}", 2.0, counter=True),
         Sample("frontier", "news", f"duplicates@{segment}", 0.0, counter=True)],
        at=now - 2 * MINUTE))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    status, answer = srv.api("POST", "/jobs/", {
        "name": "count-items", "env": env,
        "command": [sys.executable, str(ITEM_JOB), "20", "0.1"]})
    assert status == 201, answer
    status, answer = srv.api("POST", "/jobs/", {
        "name": "spider", "env": {**env, "START": f"{site.url}/page/0",
                                  "MISSING": f"{site.url}/page/404"},
        "command": [sys.executable, "-m", "scrapy", "runspider", str(SPIDER),
                    "-s", f"EXTENSIONS={json.dumps({EXTENSION: 500})}",
                    "-s", "TELNETCONSOLE_ENABLED=False", "-s", "LOG_LEVEL=INFO"]})
    assert status == 201, answer
    spider = start_run(srv, "spider")
    # the first run is sampled while it counts (slowly: 20 items in 2 s), then once more
    # when it has ended; the second ends between two samples, never seen running
    run_id = start_run(srv, "count-items")
    deadline = time.monotonic() + 30
    while not get_run(srv, run_id)["counters"].get("success"):
        assert time.monotonic() < deadline, "the item job counted nothing"
        time.sleep(0.05)
    world.tick()
    assert wait_run(srv, run_id)["counters"]["success"] == 20
    world.tick()
    world.runs["items-1"] = run_id
    status, answer = srv.api("PATCH", "/jobs/count-items", {
        "command": [sys.executable, str(ITEM_JOB), "20", "0.005"]})
    assert status == 200, answer
    world.runs["items-2"] = start_run(srv, "count-items")
    assert wait_run(srv, world.runs["items-2"])["counters"]["success"] == 20
    world.runs["spider"] = spider
    assert wait_run(srv, spider)["status"] == "succeeded"
    srv.run(beat_hostile(srv.app))  # alive for this sample, however long the runs took
    assert world.tick() > 0  # outbound, agent, frontier now


def snapshot(page: Any) -> Snapshot:
    found = page.eval_on_selector_all("figure.chart", SNAPSHOT_JS)
    return {chart: sorted((s, x, v) for s, x, v in points) for chart, _, points in found}


def series(shot: Snapshot, chart: str, name: str) -> list[float]:
    return [v for s, _, v in shot[chart] if s == name]


def open_charts(page: Any, path: str, block: str) -> Snapshot:
    page.goto(path)
    page.wait_for_selector(f"#{block} figure.chart")
    return snapshot(page)


def shots(page: Any, name: str) -> None:
    path = artifacts_dir() / f"charts-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    _shots.append(path)


@pytest.fixture
def chart_page(browser: Any, charted: Charted, watch: Watch,
               request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from _page(browser, charted.server, watch, request,
                     login(browser, charted.server))


def test_queue_agent_and_frontier_charts_show_the_stores_points_and_escape_names(
        chart_page: Any, charted: Charted) -> None:
    page = chart_page
    now = time.time()
    shot = open_charts(page, "/ui/queues", "queues-charts")
    shots(page, "queues")
    stored = charted.read("outbound", since=now - 3600, subjects=["default"])
    depth = [round(p.mean, 3) for p in stored[("default", "depth")]]
    # four minutes of history, then the 5 tasks, sampled in one minute or more (the
    # fixture's runs may take over a minute on a loaded machine)
    assert depth[:4] == [10, 20, 30, 40] and set(depth[4:]) == {5}
    assert series(shot, "outbound-depth", "default") == depth
    assert sorted(series(shot, "outbound-rate", "default")) == sorted(
        round(p.mean, 3) for p in stored[("default", "rate")])

    shot = open_charts(page, "/ui/agents", "agents-charts")
    shots(page, "agents")
    qps = series(shot, "agent-qps", HOSTILE_AGENT)
    assert qps[:4] == [1, 2, 3, 4] and set(qps[4:]) == {4.5}
    stored = charted.read("agent", since=now - 3600, subjects=[HOSTILE_AGENT])
    assert qps == [round(p.mean, 3) for p in stored[(HOSTILE_AGENT, "qps")]]
    memory = series(shot, "agent-memory", HOSTILE_AGENT)
    assert memory[:4] == [2**20, 2 * 2**20, 3 * 2**20, 4 * 2**20]
    assert set(memory[4:]) == {50 * 2**20}
    legend = page.locator("#chart-agent-qps .legend li").first.inner_text()
    assert legend == HOSTILE_AGENT  # shown as text
    assert page.evaluate("window.__xss") is None

    shot = open_charts(page, "/ui/frontier", "frontier-charts")
    shots(page, "frontier")
    bars = {s: v for s, _, v in shot["frontier-segments"]}
    assert bars == {"admitted": 5, "duplicates": 2}
    stored = charted.read("frontier", since=now - 3600, subjects=["news"])
    assert {m.split("@")[0]: p[-1].latest for (_, m), p in stored.items()} == bars
    # per minute: 3 more admitted and 2 duplicates since the sample two minutes before
    per_minute = {"admitted": 0.0, "duplicates": 0.0}
    for name, _, value in shot["frontier-minutes"]:
        per_minute[name] += value
    assert per_minute == {"admitted": 3, "duplicates": 2}


def test_a_scrapy_runs_page_shows_its_final_stats_and_its_pages_per_minute(
        chart_page: Any, charted: Charted) -> None:
    page = chart_page
    run_id = charted.runs["spider"]
    counters = get_run(charted.server, run_id)["counters"]
    shot = open_charts(page, f"/ui/run/{run_id}", "run-charts")
    shots(page, "scrapy-run")

    def stat(name: str) -> str:
        return str(page.locator(f'#scrapy-stats [data-stat="{name}"] dd').inner_text())

    assert stat("finish_reason") == "finished"
    assert stat("item_scraped_count") == str(counters["item_scraped_count"])
    assert counters["item_scraped_count"] == 19  # 20 pages, page 3's callback raised
    assert stat("log_count/ERROR") == str(counters["log_count/ERROR"]) != "0"
    assert stat("elapsed_time_seconds").endswith(("ms", " s"))
    statuses = {row.get_attribute("data-status"): row.locator("td.num").inner_text()
                for row in page.locator("#scrapy-statuses tbody tr").all()}
    assert statuses == {"200": "20", "404": "1"}
    # the run ended between two samples: its final figures are its last minute's
    assert sum(series(shot, "run", "pages")) == counters["response_received_count"] == 21
    assert sum(series(shot, "run", "items")) == 19


def test_a_jobs_page_compares_its_last_runs_in_a_table_and_charts(
        chart_page: Any, charted: Charted) -> None:
    page = chart_page
    runs = [charted.runs["items-2"], charted.runs["items-1"]]
    shot = open_charts(page, "/ui/job/count-items", "job-charts")
    shots(page, "job")
    rows = page.locator("#compare tbody tr")
    assert [r.get_attribute("data-key") for r in rows.all()] == runs  # newest first
    assert [r.locator('[data-field="pages"]').inner_text() for r in rows.all()] == [
        "20", "20"]
    assert series(shot, "job-runs", "pages") == [20, 20]
    # per minute across both runs: the first as sampled (its newest count, from 0 at
    # its start), the second from its final counters (it was never seen running)
    stored = charted.read("run", since=0, subjects=runs, metrics=["pages"])
    assert list(stored) == [(charted.runs["items-1"], "pages")]
    assert stored[(charted.runs["items-1"], "pages")][-1].latest == 20
    assert sum(series(shot, "job", "pages")) == 40
    assert page.locator("h1").inner_text() == "Job count-items"


def test_every_chart_shows_the_same_points_after_a_restart(
        browser: Any, charted: Charted, watch: Watch,
        request: pytest.FixtureRequest) -> None:
    pages = [(path, f"{path.rsplit('/', 1)[1]}-charts") for path in PAGES]
    pages += [(f"/ui/run/{charted.runs['spider']}", "run-charts"),
              (f"/ui/run/{charted.runs['items-1']}", "run-charts"),
              ("/ui/job/count-items", "job-charts")]

    def look() -> list[Snapshot]:
        found = []
        for page in _page(browser, charted.server, watch, request,
                          login(browser, charted.server)):
            found = [open_charts(page, path, block) for path, block in pages]
        return found

    before = look()
    empty = [(path, chart) for (path, _), shot in zip(pages, before, strict=True)
             for chart, points in shot.items() if not points]
    assert not empty, f"charts without a point: {empty}"
    charted.restart()
    assert look() == before

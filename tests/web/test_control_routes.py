"""The control plane's pages without a browser: every page and fragment answers under the
CSP, names, notes, task codes and log lines with markup show as text, secrets never show,
lists are paged by key, and the buttons and folded sections point at the right URLs."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.control.jobs import JobSpec
from crawlhub.control.logs import LogLine
from crawlhub.services import Services
from crawlhub.web.render import CSP
from crawlhub.web.runs import task_id

HOSTILE = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[tuple[httpx2.AsyncClient, Services]]:
    config = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path),
        "storage": {"queues": f"sqlite:///{tmp_path}/q.db", "state": f"sqlite:///{tmp_path}/h.db"},
        "outbound": [{"name": "default", "init": {"key": "default"}}],
        "control": {"scheduler": False},
    })
    svc = await Services.open(config)
    await svc.start()
    client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=create_app(services=svc),
                                                               raise_app_exceptions=False),
                                base_url="http://crawlhub.test")
    try:
        yield client, svc
    finally:
        await client.aclose()
        await svc.close()


def keys(text: str, table: str) -> list[str]:
    body = text.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<tr data-key="([^"]*)"', body)


async def a_run(svc: Services, job: str, *, tasks: dict[str, str] | None = None,
                lines: list[LogLine] | None = None, status: str = "succeeded") -> str:
    """A finished run of ``job`` with its tasks (name -> status) and log lines, written
    as the runner writes them."""
    assert svc.control is not None
    store = svc.control.jobs.store
    spec = await store.get(job)
    now = time.time()
    run = await store.claim_run(spec, trigger="api", now=now - 10)
    for i, (task, task_status) in enumerate((tasks or {}).items()):
        await store.task_event(run.id, task, "running", now - 9 + i)
        await store.task_event(run.id, task, task_status, now - 8.5 + i)
    if status != "running":
        await store.finish(run.id, status=status, now=now, exit_code=0 if status ==
                           "succeeded" else 1, error=None, counters={"success": 7})
    for line in lines or []:
        line.run = run.id
    await svc.control.logs.write(lines or [])
    await svc.control.logs.flush()
    return run.id


async def test_every_control_page_and_fragment_answers_html_under_the_csp(
        web: tuple[httpx2.AsyncClient, Services]) -> None:
    client, svc = web
    assert (await client.post("/jobs/", json={"name": "news", "command": ["true"]})
            ).status_code == 201
    run = await a_run(svc, "news", tasks={"fetch": "succeeded"})
    paths = ["/ui/jobs", "/ui/jobs/live", "/ui/job/news", "/ui/job/news/live", "/ui/runs",
             "/ui/runs/live", f"/ui/run/{run}", f"/ui/run/{run}/live",
             f"/ui/run/{run}/log?task=fetch", "/ui/logs", "/ui/logs?tail=1&job=news",
             "/ui/projects", "/ui/projects/live", "/ui/alerts", "/ui/alerts/live"]
    for path in paths:
        r = await client.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["content-type"].startswith("text/html"), path
        assert r.headers["content-security-policy"] == CSP, path
        assert "<script>" not in r.text and " style=" not in r.text, path
        assert "http" + "s://" not in r.text, path
    nav = (await client.get("/")).text
    for href in ("/ui/projects", "/ui/jobs", "/ui/runs", "/ui/logs", "/ui/alerts"):
        assert f'<a href="{href}"' in nav
    for title in ("Jobs", "Runs", "Projects and builds", "Alerts"):  # overview cards
        assert f">{title}</a></h2>" in nav


async def test_an_unknown_job_or_run_is_a_404_page_and_its_live_update_a_404(
        web: tuple[httpx2.AsyncClient, Services]) -> None:
    client, _ = web
    for path, text in (("/ui/job/nope", "job named &#39;nope&#39;"),
                       ("/ui/run/r0nope", "run &#39;r0nope&#39;")):
        r = await client.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert f"There is no {text}" in r.text
        live = await client.get(path + "/live")
        assert live.status_code == 404 and "no " in live.json()["detail"]


async def test_markup_in_notes_tasks_and_log_lines_shows_as_text(
        web: tuple[httpx2.AsyncClient, Services]) -> None:
    client, svc = web
    assert (await client.post("/jobs/", json={"name": "news", "command": ["true"],
                                              "notes": HOSTILE, "env": {"TOKEN": "s3cr3t-v"}})
            ).status_code == 201
    run = await a_run(svc, "news", tasks={HOSTILE: "failed"},
                      lines=[LogLine(ts=time.time(), message=HOSTILE, job="news",
                                     task=HOSTILE)])
    escaped = "&lt;script&gt;window.__xss=1&lt;/script&gt;"
    for path in ("/ui/job/news", f"/ui/run/{run}", f"/ui/run/{run}/log?task={HOSTILE}",
                 "/ui/logs?q=xss"):
        text = (await client.get(path, params=None)).text
        assert HOSTILE not in text and escaped in text, path
    job = (await client.get("/ui/job/news")).text
    assert "<code>TOKEN</code>" in job and "s3cr3t-v" not in job  # env names, not values
    page = (await client.get(f"/ui/run/{run}")).text
    assert f'id="task-{task_id(HOSTILE)}"' in page  # an id from a hash, not the markup


async def test_the_jobs_page_pages_by_name_filters_and_shows_state_and_buttons(
        web: tuple[httpx2.AsyncClient, Services]) -> None:
    client, svc = web
    assert svc.control is not None
    jobs = svc.control.jobs
    for i in range(120):
        await jobs.create(JobSpec(name=f"job-{i:03}", command=["true"],
                                  cron="0 4 * * *" if i % 2 else None))
    first = (await client.get("/ui/jobs")).text
    assert keys(first, "jobs") == [f"job-{i:03}" for i in range(100)]
    assert 'href="?after=job-099"' in first and 'rel="first"' not in first
    assert 'hx-get="/ui/jobs/live"' in first
    second = (await client.get("/ui/jobs?after=job-099")).text
    assert keys(second, "jobs") == [f"job-{i:03}" for i in range(100, 120)]
    assert '<a rel="first" href="?">' in second and 'rel="next"' not in second
    assert 'hx-get="/ui/jobs/live?after=job-099"' in second  # polls the page it shows
    only = (await client.get("/ui/jobs?prefix=job-11")).text
    assert keys(only, "jobs") == [f"job-{i:03}" for i in range(110, 120)]
    assert keys((await client.get("/ui/jobs?prefix=zz")).text, "jobs") == []
    # the row: cron, next tick (relative and absolute), state, buttons on the JSON API
    await jobs.pause("job-001")
    row = first.split('<tr data-key="job-001">')[1].split("</tr>")[0]
    assert "<code>0 4 * * *</code>" in row and re.search(r"in \d+ (h|min)", row)
    assert re.search(r"\d{4}-\d\d-\d\dT04:00:00Z", row)
    for action in ("run", "pause", "restart", "cancel"):
        assert f'hx-post="/jobs/job-001/{action}"' in row
    paused = (await client.get("/ui/jobs/live?prefix=job-001")).text
    assert 'badge tone-wait">paused<' in paused
    assert 'hx-post="/jobs/job-001/continue"' in paused
    assert 'hx-post="/jobs/job-001/pause"' not in paused


async def test_a_run_shows_its_timeline_figures_and_folds_each_task_onto_its_log(
        web: tuple[httpx2.AsyncClient, Services]) -> None:
    client, svc = web
    await client.post("/jobs/", json={"name": "news", "command": ["true"]})
    now = time.time()
    lines = [LogLine(ts=now, message=f"{task} line {i}", job="news", task=task)
             for task in ("fetch", "parse") for i in range(3)]
    run = await a_run(svc, "news", tasks={"fetch": "succeeded", "parse": "failed"},
                      lines=lines)
    page = (await client.get(f"/ui/run/{run}")).text
    assert page.count('class="tl-row"') == 2
    assert f'hx-get="/ui/run/{run}/log?task=fetch"' in page
    assert 'data-figure="success"><dt>Success</dt><dd>7</dd>' in page
    assert 'data-counter="success"' in page
    assert "data-tail" not in page  # finished: no live tail, no polling
    assert 'hx-trigger="refresh"' in page
    assert "/cancel" not in page  # over: nothing to cancel
    log = (await client.get(f"/ui/run/{run}/log?task=parse")).text
    assert re.findall(r'class="msg">([^<]*)<', log) == [f"parse line {i}" for i in range(3)]
    whole = re.findall(r'class="msg">([^<]*)<', page)
    assert whole == [line.message for line in lines]
    # a run going on polls its block and tails its log from the last line shown
    going = await a_run(svc, "news", status="running")
    page = (await client.get(f"/ui/run/{going}")).text
    assert 'hx-trigger="every 2s, refresh"' in page
    assert f'hx-post="/runs/{going}/cancel"' in page  # this run alone, not its job
    assert re.search(rf'data-tail="/logs/tail\?run={going}&amp;after=\d+"', page)
    runs = (await client.get("/ui/runs?job=news")).text
    assert keys(runs, "runs") == [going, run]
    assert keys((await client.get("/ui/runs?status=failed")).text, "runs") == []


async def test_log_search_reads_in_time_order_with_older_and_newer_pages(
        web: tuple[httpx2.AsyncClient, Services]) -> None:
    client, svc = web
    assert svc.control is not None
    now = time.time()
    await svc.control.logs.write([LogLine(ts=now + i / 1000, message=f"line {i:03}",
                                          job="big", level="warning" if i % 50 == 0
                                          else "info") for i in range(250)])
    await svc.control.logs.flush()

    def messages(text: str) -> list[str]:
        return re.findall(r'class="msg">([^<]*)<', text)

    first = (await client.get("/ui/logs?job=big")).text
    assert messages(first) == [f"line {i:03}" for i in range(150, 250)]
    older = re.search(r'rel="prev" href="\?job=big&amp;before=(\d+)"', first)
    assert older and 'rel="next"' not in first
    second = (await client.get(f"/ui/logs?job=big&before={older[1]}")).text
    assert messages(second) == [f"line {i:03}" for i in range(50, 150)]
    newer = re.search(r'rel="next" href="\?job=big&amp;after=(\d+)"', second)
    assert newer
    back = (await client.get(f"/ui/logs?job=big&after={newer[1]}")).text
    assert messages(back) == messages(first)
    warnings = (await client.get("/ui/logs?job=big&level=warning&q=line")).text
    assert messages(warnings) == ["line 000", "line 050", "line 100", "line 150", "line 200"]
    follow = (await client.get("/ui/logs?job=big&q=line&tail=1")).text
    tail = re.search(r'data-tail="([^"]+)"', follow)
    assert tail and tail[1].startswith("/logs/tail?job=big&amp;q=line&amp;after=")
    bad = (await client.get("/ui/logs?since=yesterday-ish")).text
    assert 'class="problem"' in bad and "since=" in bad


async def test_projects_show_builds_and_never_a_password(
        web: tuple[httpx2.AsyncClient, Services], tmp_path: Path) -> None:
    client, svc = web
    assert svc.control is not None
    r = await client.post("/projects/", json={
        "name": "shop", "git_url": str(tmp_path / "no-such-repo"), "username": "ci",
        "password": "hunter2-pass", "webhook_secret": "hook-secret-123"})
    assert r.status_code == 201, r.text
    build = await svc.control.builds.start("shop", ref="main", version="dev")
    await svc.control.builds.wait(build.id, timeout=30)
    page = (await client.get("/ui/projects")).text
    assert "hunter2-pass" not in page and "hook-secret-123" not in page
    row = page.split('<tr data-key="shop"')[1].split("</tr>")[0]
    assert 'data-col="password"><span class="badge tone-info">stored<' in row
    assert 'hx-post="/projects/shop/builds"' in row and "data-drop-empty" in row
    assert keys(page, "builds") == [str(build.id)]
    assert f'hx-get="/ui/build/{build.id}/log"' in page
    assert 'badge tone-bad">failed<' in page
    log = (await client.get(f"/ui/build/{build.id}/log")).text
    assert log.startswith('\n<pre class="build-log">') or '<pre class="build-log">' in log
    other = (await client.get("/ui/projects/live?project=else")).text
    assert keys(other, "builds") == []


async def test_alert_routes_show_the_target_masked_and_a_test_button(
        web: tuple[httpx2.AsyncClient, Services]) -> None:
    client, _ = web
    secret = "/services/T0/B0/xoxb-very-secret"
    r = await client.post("/alerts/", json={"name": "ops", "kind": "webhook",
                                            "url": f"http://127.0.0.1:9/{secret}",
                                            "jobs": ["news*"]})
    assert r.status_code == 201, r.text
    answer = (await client.post("/alerts/ops/test")).json()
    assert answer["ok"] is False  # nothing listens on port 9
    page = (await client.get("/ui/alerts")).text
    assert "xoxb-very-secret" not in page
    assert "<code>http://127.0.0.1:9/***</code>" in page and "news*" in page
    assert 'hx-post="/alerts/ops/test"' in page and 'data-answer="#test-1"' in page
    assert keys(page, "deliveries") and 'badge tone-bad">failed<' in page


async def test_the_job_form_offers_built_images_and_makes_a_container_job_of_the_choice(
        web: tuple[httpx2.AsyncClient, Services]) -> None:
    client, svc = web
    assert svc.control is not None
    builds = svc.control.builds
    # a finished image build, as the image builder leaves it (the engine is not needed)
    await builds.db.execute(
        f"INSERT INTO {builds.table} (project, tag, ref, version, status, builder, trigger,"
        " artifact, created) VALUES ('shop', 'release/shop/1.4', 'release/shop/1.4', '1.4',"
        " 'succeeded', 'image', 'hook', $1, 1.0)",
        '{"kind": "image", "path": "crawlhub/shop:1.4", "meta": {"id": "abc", "size": 1}}')
    page = (await client.get("/ui/jobs")).text
    assert '<option value="build:shop:1.4">crawlhub/shop:1.4</option>' in page
    made = await client.post("/ui/jobs/new", headers={"HX-Request": "true"}, json={
        "name": "shop-daily", "cron": "0 3 * * *", "image": "build:shop:1.4",
        "command": "python3 spider.py --pages '10 20'", "notes": "seed 001"})
    assert made.status_code == 201, made.text
    spec = await svc.control.jobs.store.get("shop-daily")
    assert (spec.runtime, spec.project, spec.version) == ("container", "shop", "1.4")
    assert spec.command == ["python3", "spider.py", "--pages", "10 20"]
    assert spec.cron == "0 3 * * *"
    plain = await client.post("/ui/jobs/new", headers={"HX-Request": "true"}, json={
        "name": "plain", "image": "localhost/crawlhub-base:1", "command": "python3 -V"})
    assert plain.status_code == 201, plain.text
    assert (await svc.control.jobs.store.get("plain")).image == "localhost/crawlhub-base:1"
    bad = await client.post("/ui/jobs/new", headers={"HX-Request": "true"},
                            json={"name": "bad", "command": "echo 'unclosed"})
    assert bad.status_code == 422 and "quote it" in bad.text

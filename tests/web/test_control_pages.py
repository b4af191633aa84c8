"""The control plane's pages end to end in headless Chromium, on the harness's real server
(``conftest.py``): every page loads clean; a real job (a Python script on
``crawlhub.sdk`` that counts and logs a line per item) is run with the button, its log
lines arrive live, it is paused (its counter stops) and continued (it counts again) with
the buttons; a task's log folds open; a log line is searched and followed live; a build
is started from its form; an alert route's test reaches a webhook on 127.0.0.1.

Screenshots: ``jobs.png``, ``job.png``, ``run.png``, ``logs.png``, ``projects.png``,
``alerts.png`` in the harness's artifacts directory (besides one per test)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.control.alert_targets import HOOK_PATH, WebhookReceiver
from tests.control.alert_targets import TOKEN as HOOK_TOKEN

from .conftest import Server, Watch, _seed, _shots, artifacts_dir

#: A job that counts items in tasks of 10, logging each (crawlhub.sdk).
ITEM_JOB = Path(__file__).parents[1] / "control" / "item_job.py"

PAGES = [("/ui/projects", "Projects and builds"), ("/ui/jobs", "Jobs"), ("/ui/runs", "Runs"),
         ("/ui/logs", "Logs"), ("/ui/alerts", "Alerts")]


@pytest.fixture(autouse=True, scope="module")
def _seeded_agents_beat_again(server: Server) -> Any:
    """The harness seeds its agents once and other modules expect the first one alive;
    an agent is dead after 11 s of silence and these tests take longer: beat again."""
    yield
    server.run(_seed(server.app))


def snap(page: Any, name: str) -> None:
    """A full-page screenshot named for what it shows (``jobs.png``)."""
    path = artifacts_dir() / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    _shots.append(path)


def counter_job(name: str, items: int) -> dict[str, Any]:
    return {"name": name, "command": [sys.executable, str(ITEM_JOB), str(items)],
            "env": {"PYTHONPATH": os.pathsep.join(sys.path)},
            "notes": "counts items for the web page's tests <b>not bold</b>"}


def figure(page: Any, name: str) -> int:
    text = page.locator(f"#queue [data-figure={name}] dd").inner_text()
    return int(text.replace(",", "")) if text.strip("-").strip() else -1


def steady(page: Any, name: str, *, within: float = 12.0, quiet: float = 2.5) -> int:
    """The figure once it has stopped moving for ``quiet`` seconds (the page polls every
    2 s, the runner stores counters about every second)."""
    deadline = time.monotonic() + within
    value, since = figure(page, name), time.monotonic()
    while time.monotonic() < deadline:
        page.wait_for_timeout(250)
        now = figure(page, name)
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return value
    raise AssertionError(f"{name} kept moving for {within} s (last {value})")


def test_every_control_page_loads_clean_and_lights_its_nav(page: Any, server: Server,
                                                           watch: Watch) -> None:
    page.goto("/")
    nav = [a.get_attribute("href") for a in page.locator("nav.areas a").all()]
    assert nav[-5:] == [path for path, _ in PAGES]
    for path, heading in PAGES:
        page.goto(path)
        expect(page.locator("h1")).to_have_text(heading)
        expect(page.locator("nav.areas a[aria-current=page]")).to_have_attribute("href", path)
        live = page.locator(".live")
        if live.count():
            with page.expect_response(re.compile(r"/live")) as answer:
                live.first.dispatch_event("refresh")
            assert answer.value.status == 200
    watch.allow(r"status of 404")  # the page below, on purpose
    page.goto("/ui/job/no-such-job")
    expect(page.locator(".problem")).to_have_text("There is no job named 'no-such-job'.")


def test_run_a_job_with_its_button_follow_its_log_pause_and_continue_it(
        page: Any, server: Server, watch: Watch) -> None:
    status, answer = server.api("POST", "/jobs/", counter_job("web-count", 100_000))
    assert status == 201, answer
    page.on("dialog", lambda dialog: dialog.accept())  # Cancel asks first
    page.goto("/ui/jobs?prefix=web-count")
    row = page.locator("#jobs tr[data-key=web-count]")
    expect(row.locator("[data-col=state] .badge")).to_have_text("idle")
    expect(row.locator("[data-col=last]")).to_have_text("never run")
    row.get_by_role("button", name="Run").click()
    expect(page.locator("#flash")).to_have_text("Run: done")
    expect(row.locator("[data-col=state] .badge")).to_have_text("running")
    expect(row.locator("[data-col=last] .badge")).to_have_text("running")
    snap(page, "jobs")
    watch.allow(r"status of 409|Response Status Error Code 409")  # the refusal below
    row.get_by_role("button", name="Run").click()  # max_instances is 1: the API says no
    expect(page.locator("#flash")).to_have_text(re.compile(
        r"^Run failed: job 'web-count' has 1 run\(s\) going .* max_instances is 1"))

    # the run: its log lines arrive live (the SSE tail), its tasks fold open
    row.locator("[data-col=last] a").click()
    page.wait_for_url(re.compile(r"/ui/run/r[0-9a-f]+$"))
    page.evaluate("window.__loaded_once = true")
    log = page.locator("#run-log")
    expect(log.locator(".tail-state")).to_have_text("live")
    # the runner logs each task's start and end too: count the job's own lines
    items = log.locator(".log-line .msg").filter(has_text=re.compile(r"^item \d+ counted$"))
    shown = items.count()
    expect(items.nth(shown + 5)).to_be_attached()
    first_task = page.locator(".timeline details.tl-row").first
    expect(first_task.locator(".tl-label")).to_have_text("step-0")
    first_task.locator("summary").click()
    task_lines = first_task.locator(".tl-body .log-line .msg")
    task_items = task_lines.filter(has_text=re.compile(r"^item "))
    expect(task_items).to_have_count(10)
    expect(task_items.first).to_have_text("item 1 counted")
    expect(task_items.last).to_have_text("item 10 counted")
    expect(task_lines.last).to_have_text("task step-0 succeeded")
    expect(page.locator("#run-head [data-field=status] .badge")).to_have_text("running")
    assert page.evaluate("window.__loaded_once") is True  # all of it without a reload
    snap(page, "run")

    # pause: the state says so and the counter stops; continue: it counts on
    page.locator("h1 a").click()
    page.wait_for_url(server.url + "/ui/job/web-count")
    state = page.locator("#job-live .job-head .job-state .badge")
    expect(state).to_have_text("running")
    expect(page.locator("#queue [data-figure=success] dd")).not_to_have_text("-")
    page.get_by_role("button", name="Pause").click()
    expect(state).to_have_text("paused")
    held = steady(page, "success")
    page.wait_for_timeout(2500)  # a paused job's counter stays put
    assert figure(page, "success") == held
    snap(page, "job")
    page.get_by_role("button", name="Continue").click()
    expect(state).to_have_text("running")
    expect(page.locator("#queue [data-figure=success] dd")).not_to_have_text(
        f"{held:,}", timeout=8000)
    assert figure(page, "success") > held

    # cancel: the run ends and the job is idle again
    page.get_by_role("button", name="Cancel").click()
    expect(state).to_have_text("idle", timeout=15000)
    expect(page.locator("#runs tbody tr").first.locator(".badge")).not_to_have_text("running")


def test_search_a_log_line_and_follow_new_ones_live(page: Any, server: Server) -> None:
    from crawlhub.control.logs import LogLine

    logs = server.services.control.logs
    now = time.time()
    found = [LogLine(ts=now, message=f"web search needle {i} <i>kept as text</i>",
                     job="web-search", run="r-web", task="fetch", level="warning")
             for i in range(3)]
    noise = [LogLine(ts=now, message=f"unrelated line {i}", job="web-search")
             for i in range(5)]
    server.run(logs.write(noise + found))
    server.run(logs.flush())
    page.goto("/ui/logs")
    page.fill("input[name=q]", "needle")
    page.select_option("select[name=level]", "warning")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"/ui/logs\?q=needle&.*level=warning"))
    messages = page.locator("#log-results .log-line .msg")
    expect(messages).to_have_text([line.message for line in found])
    expect(page.locator("#log-results .log-line .codes").first).to_have_text(
        "web-search/r-web/fetch")
    expect(page.locator("#found")).to_contain_text("3 lines")
    page.locator("#tail-toggle").click()
    expect(page.locator("#log-results .tail-state")).to_have_text("live")
    server.run(logs.write([LogLine(ts=time.time(), message="web search needle 3 live",
                                   job="web-search", level="error"),
                           LogLine(ts=time.time(), message="needle but only info",
                                   job="web-search")]))
    expect(messages).to_have_count(4)
    expect(messages.last).to_have_text("web search needle 3 live")
    snap(page, "logs")


def test_a_build_starts_from_its_form_and_its_log_folds_open(page: Any, server: Server,
                                                             watch: Watch) -> None:
    status, answer = server.api("POST", "/projects/", {
        "name": "web-shop", "git_url": str(server.data_dir / "no-such-remote"),
        "username": "ci", "password": "web-pass-never-shown"})
    assert status == 201, answer
    page.goto("/ui/projects")
    row = page.locator("#projects tr[data-key=web-shop]")
    expect(row.locator("[data-col=password]")).to_have_text("stored")
    assert "web-pass-never-shown" not in page.content()
    row.locator("input[name=version]").fill("dev")  # the tag stays empty: not sent
    row.get_by_role("button", name="Build").click()
    expect(page.locator("#flash")).to_have_text("Build web-shop: done")
    build = page.locator("#builds tbody tr").first
    expect(build.locator("td").nth(1)).to_have_text("web-shop")
    expect(build.locator("[data-col=status] .badge")).to_have_text("failed", timeout=15000)
    build.locator("details.fold summary").click()
    expect(build.locator("pre.build-log")).not_to_be_empty()
    snap(page, "projects")


def test_the_alert_test_button_reaches_a_local_webhook_and_says_ok(
        page: Any, server: Server) -> None:
    receiver: WebhookReceiver = server.run(WebhookReceiver().start())
    try:
        for name, url in (("web-ops", receiver.url()),
                          ("web-down", "http://127.0.0.1:9/hooks/nothing-listens")):
            status, answer = server.api("POST", "/alerts/", {
                "name": name, "kind": "webhook", "url": url, "jobs": ["web-*"]})
            assert status == 201, answer
        page.goto("/ui/alerts")
        ops = page.locator("#routes tr[data-key=web-ops]")
        expect(ops.locator("code")).to_have_text(f"http://127.0.0.1:{receiver.port}/***")
        assert HOOK_TOKEN not in page.content()
        ops.get_by_role("button", name="Test").click()
        expect(ops.locator("output")).to_have_text(re.compile(r"^ok HTTP 200"))
        assert [hit.path for hit in receiver.hits] == [HOOK_PATH]
        down = page.locator("#routes tr[data-key=web-down]")
        down.get_by_role("button", name="Test").click()
        expect(down.locator("output")).to_have_text(re.compile(r"^failed \S"))
        sent = page.locator("#deliveries tbody tr")
        expect(sent.first.locator(".badge")).to_have_text("failed")
        expect(sent.nth(1).locator(".badge")).to_have_text("sent")
        snap(page, "alerts")
    finally:
        server.run(receiver.stop())

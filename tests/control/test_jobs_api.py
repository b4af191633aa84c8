"""``/jobs/`` and ``/runs/`` over the whole app: create, run, pause, continue, cancel,
restart, queue figures, run history; 4xx bodies that say what is wrong."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.services import Services
from tests.helpers import wait_for

#: items in tasks of 10, a log line and the success/total counters each (a real process)
ITEM_JOB = Path(__file__).with_name("item_job.py")


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx2.AsyncClient, Services]]:
    config = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "control": {"grace": 1},
        "outbound": [{"name": "default", "init": {"key": "default"}}]})
    svc = await Services.open(config)
    await svc.start()
    app = create_app(services=svc)
    try:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                      base_url="http://test") as client:
            yield client, svc
    finally:
        await svc.close()


def counter_job(name: str, n: int, **more: object) -> dict[str, object]:
    return {"name": name, "command": [sys.executable, str(ITEM_JOB), str(n), "0.01"],
            "env": {"PYTHONPATH": os.pathsep.join(sys.path)}, **more}


async def test_a_job_is_made_run_and_its_history_read(api: tuple[httpx2.AsyncClient, Services],
                                                      tmp_path: Path) -> None:
    client, _ = api
    resp = await client.post("/jobs/", json=counter_job("count", 25,
                                                        cron="0 4 * * *"))
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["name"] == "count" and body["state"] == "idle" and body["next_fire"]
    again = await client.post("/jobs/", json=counter_job("count", 25))
    assert again.status_code == 409 and "exists" in again.json()["detail"]
    started = await client.post("/jobs/count/run")
    assert started.status_code == 202
    run_id = started.json()["run_id"]

    async def ended() -> bool:
        got = (await client.get(f"/runs/{run_id}")).json()
        return got["run"]["status"] == "succeeded"

    await wait_for(ended, timeout=20)
    view = (await client.get(f"/runs/{run_id}")).json()
    assert view["run"]["exit_code"] == 0 and view["run"]["counters"]["success"] == 25
    assert [t["task"] for t in view["tasks"]] == ["step-0", "step-1", "step-2"]
    assert all(t["status"] == "succeeded" for t in view["tasks"])
    queue = (await client.get("/jobs/count/queue")).json()
    assert queue["success"] == 25 and queue["total"] == 25 and queue["left"] == 0
    runs = (await client.get("/runs/", params={"job": "count"})).json()
    assert [r["id"] for r in runs] == [run_id]
    listed = (await client.get("/jobs/")).json()
    assert [j["name"] for j in listed] == ["count"]
    assert listed[0]["last_run"]["id"] == run_id


async def test_pause_continue_and_cancel_through_the_api(
        api: tuple[httpx2.AsyncClient, Services], tmp_path: Path) -> None:
    client, svc = api
    await client.post("/jobs/", json=counter_job("long", 100000))
    run_id = (await client.post("/jobs/long/run")).json()["run_id"]

    async def success() -> int:
        run = (await client.get(f"/runs/{run_id}")).json()["run"]
        return int(run["counters"].get("success", 0))

    await wait_for(lambda: success(), timeout=10)
    paused = await client.post("/jobs/long/pause")
    # "pausing" until the run holds still (the job acknowledges), then "paused"
    assert paused.status_code == 200 and paused.json()["state"] in ("pausing", "paused")

    async def held_still() -> bool:
        job = (await client.get("/jobs/long")).json()
        run = (await client.get(f"/runs/{run_id}")).json()["run"]
        return job["state"] == "paused" and run["paused"] == "cooperative"

    await wait_for(held_still, "the pause to take effect")
    await asyncio.sleep(1.5)  # a heartbeat has passed
    held = await success()
    await asyncio.sleep(1.5)
    assert await success() == held
    assert (await client.post("/jobs/long/continue")).json()["desired"] == "run"

    async def moved() -> bool:
        return await success() > held

    await wait_for(moved, timeout=10)
    cancelled = await client.post("/jobs/long/cancel", params={"wait": 10})
    assert cancelled.json()["runs"] == [run_id]
    assert (await client.get(f"/runs/{run_id}")).json()["run"]["status"] == "cancelled"


async def test_a_job_that_opts_out_of_pause_is_409_and_shown_not_pausable(
        api: tuple[httpx2.AsyncClient, Services]) -> None:
    client, _ = api
    made = await client.post("/jobs/", json=counter_job("steady", 3, pausable=False))
    assert made.status_code == 201 and made.json()["pausable"] is False
    refused = await client.post("/jobs/steady/pause")
    assert refused.status_code == 409 and "not pausable" in refused.json()["detail"]
    assert (await client.get("/jobs/steady")).json()["desired"] == "run"
    page = await client.get("/ui/job/steady")
    assert "not pausable" in page.text


async def test_log_lines_dropped_show_on_the_run_its_page_and_metrics(
        api: tuple[httpx2.AsyncClient, Services]) -> None:
    client, svc = api
    await client.post("/jobs/", json=counter_job("short", 3))
    run_id = (await client.post("/jobs/short/run")).json()["run_id"]

    async def ended() -> bool:
        return (await client.get(f"/runs/{run_id}")).json()["run"]["status"] == "succeeded"

    await wait_for(ended, timeout=20)
    run = (await client.get(f"/runs/{run_id}")).json()["run"]
    assert run["log_dropped"] == 0  # every line stored, and said so
    assert svc.control is not None
    # as a runner records a run whose lines a bound dropped while the store was away
    await svc.control.jobs.store.beat(run_id, run["finished_at"], log_dropped=1234)
    assert (await client.get(f"/runs/{run_id}")).json()["run"]["log_dropped"] == 1234
    page = (await client.get(f"/ui/run/{run_id}")).text
    assert "Log lines dropped" in page and "1,234" in page
    metrics = (await client.get("/metrics")).text
    assert "crawlhub_log_lines_dropped_total 0" in metrics
    assert "crawlhub_log_lines_sent_total" in metrics


async def test_bad_requests_say_what_is_wrong(api: tuple[httpx2.AsyncClient, Services]) -> None:
    client, _ = api
    resp = await client.post("/jobs/", json={"name": "x", "command": ["true"],
                                             "cron": "every day"})
    assert resp.status_code == 422 and "cron" in resp.json()["detail"]
    resp = await client.post("/jobs/", json={"name": "x"})
    assert resp.status_code == 409 and "no command" in resp.json()["detail"]
    resp = await client.post("/jobs/", json={"name": "x", "command": ["true"], "kind": "shell"})
    assert resp.status_code == 422
    assert (await client.get("/jobs/nope")).status_code == 404
    assert (await client.post("/jobs/nope/run")).status_code == 404
    assert (await client.get("/runs/nope")).status_code == 404
    resp = await client.get("/runs/", params={"status": "exploded"})
    assert resp.status_code == 422 and "exploded" in resp.json()["detail"]
    resp = await client.patch("/jobs/nope", json={"cron": "* * * * *"})
    assert resp.status_code == 404


async def test_restart_and_max_instances(api: tuple[httpx2.AsyncClient, Services],
                                         tmp_path: Path) -> None:
    client, _ = api
    await client.post("/jobs/", json=counter_job("busy", 100000))
    first = (await client.post("/jobs/busy/run")).json()["run_id"]
    second = await client.post("/jobs/busy/run")
    assert second.status_code == 409 and "max_instances is 1" in second.json()["detail"]
    restarted = await client.post("/jobs/busy/restart")
    assert restarted.status_code == 202 and restarted.json()["run_id"] != first
    assert (await client.get(f"/runs/{first}")).json()["run"]["status"] == "cancelled"
    await client.post("/jobs/busy/cancel", params={"wait": 10})
    resp = await client.delete("/jobs/busy")
    assert resp.status_code == 204
    assert (await client.get("/jobs/busy")).status_code == 404


async def test_one_run_is_cancelled_through_the_api_and_the_others_go_on(
        api: tuple[httpx2.AsyncClient, Services]) -> None:
    client, _ = api
    await client.post("/jobs/", json=counter_job("pair", 100000, max_instances=2))
    first = (await client.post("/jobs/pair/run")).json()["run_id"]
    second = (await client.post("/jobs/pair/run")).json()["run_id"]
    resp = await client.post(f"/runs/{first}/cancel", params={"wait": 10})
    assert resp.status_code == 200, resp.text
    assert resp.json()["id"] == first and resp.json()["status"] == "cancelled"
    assert (await client.get(f"/runs/{second}")).json()["run"]["status"] == "running"
    again = await client.post(f"/runs/{first}/cancel")
    assert again.status_code == 409 and "nothing to cancel" in again.json()["detail"]
    assert (await client.post("/runs/nope/cancel")).status_code == 404
    assert (await client.post(f"/runs/{second}/cancel", params={"wait": -1})).status_code == 422
    await client.post("/jobs/pair/cancel", params={"wait": 10})
    assert (await client.get(f"/runs/{second}")).json()["run"]["status"] == "cancelled"


async def test_a_patch_that_makes_a_job_invalid_is_422(api: tuple[httpx2.AsyncClient, Services]
                                                       ) -> None:
    client, _ = api
    assert (await client.post("/jobs/", json={"name": "p", "command": ["true"]})).status_code == 201
    resp = await client.patch("/jobs/p", json={"args": ["a\x00b"]})
    assert resp.status_code == 422 and "NUL" in resp.json()["detail"]
    resp = await client.patch("/jobs/p", json={"env": {"CRAWLHUB_JOB": "x"}})
    assert resp.status_code == 422 and "set by the runner" in resp.json()["detail"]


async def test_a_job_runs_in_its_projects_build(api: tuple[httpx2.AsyncClient, Services],
                                                tmp_path: Path) -> None:
    """project -> release tag -> build (a virtualenv with the SDK) -> a job on that
    version runs in the clone, with the venv first on PATH."""
    from tests.control.gitremote import make_remote

    client, _ = api
    remote = make_remote(tmp_path / "git", {"job.py": textwrap.dedent("""
        import os, sys
        from crawlhub import sdk
        sdk.set_counter("success", 1)
        sdk.flush()
        print("venv", sys.prefix == os.environ["VIRTUAL_ENV"], "cwd", os.getcwd())
    """)})
    remote.tag("release/shop/1.0")
    resp = await client.post("/projects/", json={"name": "shop", "git_url": remote.url})
    assert resp.status_code == 201, resp.text
    build = await client.post("/projects/shop/builds", json={"tag": "release/shop/1.0"})
    assert build.status_code == 202, build.text
    build_id = build.json()["id"]

    async def built() -> bool:
        got = (await client.get(f"/builds/{build_id}")).json()
        assert got["status"] != "failed", got
        return bool(got["status"] == "succeeded")

    await wait_for(built, timeout=30)
    resp = await client.post("/jobs/", json={"name": "shop-job", "project": "shop",
                                             "version": "1.0",
                                             "command": ["python", "job.py"]})
    assert resp.status_code == 201, resp.text
    run_id = (await client.post("/jobs/shop-job/run")).json()["run_id"]

    async def ended() -> dict[str, object]:
        run = (await client.get(f"/runs/{run_id}")).json()["run"]
        return run if run["status"] not in ("running", "queued") else {}

    run = await wait_for(ended, timeout=20)
    assert run["status"] == "succeeded" and run["version"] == "1.0", run
    async def said_venv() -> list[str]:
        lines = (await client.get("/logs", params={"run": run_id})).json()["lines"]
        return [line["message"] for line in lines if line["message"].startswith("venv")]

    said = await wait_for(said_venv, timeout=10)  # the log store writes in batches
    assert said[0].startswith("venv True cwd ") and "/builds/shop/" in said[0]
    missing = await client.post("/jobs/", json={"name": "nobuild", "project": "shop",
                                                "version": "9.9", "command": ["python"]})
    assert missing.status_code == 201
    resp = await client.post("/jobs/nobuild/run")
    assert resp.status_code == 404 and "9.9" in resp.json()["detail"]

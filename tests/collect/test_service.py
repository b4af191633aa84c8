"""CollectJobManager and the /jobs API: start, stop, status, auto_start, 404 and 409."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI

from crawlhub.api import errors
from crawlhub.api.jobs import router
from crawlhub.collect.service import CollectJobManager, JobConflict, JobNotFound
from crawlhub.config.schema import CrawlhubConfig
from tests.collect.conftest import LazyItems, job_config
from tests.httpapi import ApiServer, Fault


def make_config(tmp_path: Path, url: str, *jobs: dict[str, Any]) -> CrawlhubConfig:
    entries = []
    for over in jobs:
        job = job_config(url, **over).model_dump(mode="json")
        job["sink"] = {"type": "jsonl", "path": str(tmp_path / f"{job['name']}.jsonl")}
        entries.append(job)
    return CrawlhubConfig.model_validate({"data_dir": str(tmp_path), "jobs": entries})


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer(items=LazyItems(450)) as server:  # type: ignore[arg-type]
        yield server


@pytest.fixture
async def manager(tmp_path: Path, api: ApiServer) -> AsyncIterator[CollectJobManager]:
    cfg = make_config(
        tmp_path, api.url,
        {"name": "news", "auto_start": True, "strategy": {"filter_days": None}},
        {"name": "manual", "strategy": {"filter_days": None}},
        {"name": "off", "enabled": False, "auto_start": True},
    )
    m = CollectJobManager(cfg)
    yield m
    await m.close()


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_auto_start_runs_enabled_auto_start_jobs_only(
    manager: CollectJobManager, tmp_path: Path
) -> None:
    started = await manager.start_auto()
    assert len(started) == 1
    result = await manager.wait("news")
    assert result is not None and result.status.value == "SUCCEEDED"
    assert lines(tmp_path / "news.jsonl") == 450
    assert not (tmp_path / "manual.jsonl").exists()
    assert not manager.running("off")


async def test_status_shows_progress_last_result_and_log(manager: CollectJobManager) -> None:
    await manager.start("manual")
    await manager.wait("manual")
    status = await manager.status("manual")
    assert status["state"] == "idle"
    assert status["last_result"]["status"] == "SUCCEEDED"
    assert status["last_result"]["records"]["written"] == 450
    assert status["saved"]["last_total"] == 450
    assert any("run finished" in line for line in status["log"])


async def test_a_fresh_manager_reads_the_last_result_from_the_store(
    manager: CollectJobManager, tmp_path: Path, api: ApiServer
) -> None:
    await manager.start("manual")
    await manager.wait("manual")
    other = CollectJobManager(manager.config)
    try:
        status = await other.status("manual")
    finally:
        await other.close()
    assert status["last_result"]["status"] == "SUCCEEDED"


async def test_starting_a_running_job_is_a_conflict(manager: CollectJobManager, api: ApiServer) -> None:
    api.inject(Fault.slow(30), when=lambda r: r.query.get("offset") == "250")
    await manager.start("manual")
    with pytest.raises(JobConflict, match="already running"):
        await manager.start("manual")
    await manager.stop("manual")


async def test_disabled_and_unknown_jobs_do_not_start(manager: CollectJobManager) -> None:
    with pytest.raises(JobConflict, match="disabled"):
        await manager.start("off")
    with pytest.raises(JobNotFound, match="known jobs"):
        await manager.start("nope")


async def test_stop_cancels_and_keeps_what_was_delivered(
    manager: CollectJobManager, api: ApiServer, tmp_path: Path
) -> None:
    api.inject(Fault.slow(30), when=lambda r: r.query.get("offset") == "150")
    await manager.start("manual")
    await api.wait_for_requests(4)  # total, 350, 250, then 150 hangs
    assert manager.running("manual")
    status = await manager.status("manual")
    assert status["state"] == "running" and status["progress"]["offset"] == 150
    assert await manager.stop("manual")
    status = await manager.status("manual")
    assert status["last_result"]["status"] == "CANCELLED"
    assert status["saved"]["saved_offset"] == 150
    assert lines(tmp_path / "manual.jsonl") == 200
    assert not await manager.stop("manual")


# ---- the HTTP API -------------------------------------------------------------------------
@pytest.fixture
async def client(manager: CollectJobManager) -> AsyncIterator[httpx2.AsyncClient]:
    app = FastAPI()
    errors.install(app)
    app.include_router(router)
    app.state.services = SimpleNamespace(jobs=manager, control=None)
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def test_api_lists_jobs(client: httpx2.AsyncClient) -> None:
    resp = await client.get("/jobs/")
    assert resp.status_code == 200
    assert [j["name"] for j in resp.json()] == ["news", "manual", "off"]


async def test_api_start_status_and_stop(client: httpx2.AsyncClient, api: ApiServer) -> None:
    api.inject(Fault.slow(30), when=lambda r: r.query.get("offset") == "150")
    resp = await client.post("/jobs/manual/start")
    assert resp.status_code == 202
    run_id = resp.json()["run_id"]
    await api.wait_for_requests(4)
    resp = await client.get("/jobs/manual")
    assert resp.json()["state"] == "running" and resp.json()["run_id"] == run_id
    again = await client.post("/jobs/manual/start")
    assert again.status_code == 409 and "already running" in again.json()["detail"]
    resp = await client.post("/jobs/manual/stop")
    assert resp.status_code == 200
    assert resp.json()["stopped"] is True
    assert resp.json()["last_result"]["status"] == "CANCELLED"
    status = (await client.get("/jobs/manual")).json()
    assert status["state"] == "idle" and status["log"]


async def test_api_unknown_job_is_404_and_disabled_start_is_409(
    client: httpx2.AsyncClient,
) -> None:
    resp = await client.get("/jobs/nope")
    assert resp.status_code == 404 and "no job named 'nope'" in resp.json()["detail"]
    assert (await client.post("/jobs/nope/start")).status_code == 404
    resp = await client.post("/jobs/off/start")
    assert resp.status_code == 409 and "disabled" in resp.json()["detail"]


async def test_close_cancels_running_jobs_gracefully(manager: CollectJobManager, api: ApiServer) -> None:
    api.inject(Fault.slow(30), when=lambda r: r.query.get("offset") == "150")
    await manager.start("manual")
    await api.wait_for_requests(4)
    await asyncio.wait_for(manager.close(), 10)
    assert not manager.running("manual")


async def test_a_collection_job_runs_as_a_job_of_the_control_plane(
    manager: CollectJobManager, tmp_path: Path
) -> None:
    """The config's collection jobs are kind ``collect`` in the one job model: run through
    the control plane's runner, recorded in /runs/ with the RunResult's counts."""
    from crawlhub.control.channel import ControlChannel
    from crawlhub.control.db import ControlDB
    from crawlhub.control.jobs import JobPatch, JobService, JobStore, Runner
    from crawlhub.core.errors import ConflictError

    db = await ControlDB.open(f"sqlite:///{tmp_path}/control.db")
    channel = ControlChannel(db)
    await channel.open()
    runner = Runner(JobStore(db), channel=channel, runs_dir=tmp_path / "runs",
                    collect=manager, beat=0.2)
    jobs = JobService(runner.store, runner, collect=manager)
    await jobs.open()
    try:
        listed = await jobs.list_jobs()
        assert [(v.spec.name, v.spec.kind, v.source) for v in listed] == [
            ("manual", "collect", "config"), ("news", "collect", "config"),
            ("off", "collect", "config")]
        run = await jobs.run("manual")
        record = await asyncio.wait_for(runner.wait(run.id), 30)
        assert record.status == "succeeded" and record.kind == "collect"
        assert record.counters["items"] == 450
        assert lines(tmp_path / "manual.jsonl") == 450
        with pytest.raises(ConflictError, match="disabled"):
            await jobs.run("off")
        with pytest.raises(ConflictError, match="config"):
            await jobs.update("manual", JobPatch(cron="* * * * *"))
    finally:
        await jobs.close()
        await channel.close()
        await db.close()

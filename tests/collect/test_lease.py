"""One run per job across processes: the run lease in the metadata store, and the job log
every process reads (issue 7, item 5)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import httpx2
import pytest
import yaml
from fastapi import FastAPI

from crawlhub.api import errors
from crawlhub.api.jobs import router
from crawlhub.collect.lease import JobRunning, RunLease
from crawlhub.collect.service import CollectJobManager
from crawlhub.collect.store import SqlMetadataStore
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.fetch.cancel import CancellationToken
from tests.collect.conftest import LazyItems, job_config
from tests.helpers import FakeClock, wait_for
from tests.httpapi import ApiServer, Fault


def write_config(tmp_path: Path, url: str) -> Path:
    job = job_config(url, name="news", strategy={"filter_days": None}).model_dump(mode="json")
    job["sink"] = {"type": "jsonl", "path": str(tmp_path / "news.jsonl")}
    path = tmp_path / "crawlhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path), "jobs": [job]}))
    return path


def load(path: Path) -> CrawlhubConfig:
    from crawlhub.config.loader import load_config

    return load_config(path)


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer(items=LazyItems(450)) as server:  # type: ignore[arg-type]
        yield server


def hang_at(api: ApiServer, offset: int) -> None:
    api.inject(Fault.slow(60), when=lambda r: r.query.get("offset") == str(offset))


async def start_cli(cfg_path: Path, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from crawlhub.cli import main; main()",
        "collect", "news", "-c", str(cfg_path), "--no-progress", "--json", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def finish(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# ---- two runners, one job ---------------------------------------------------------------------
async def test_a_second_manager_gets_a_conflict_naming_pid_host_and_start(
    tmp_path: Path, api: ApiServer
) -> None:
    cfg = load(write_config(tmp_path, api.url))
    first, second = CollectJobManager(cfg), CollectJobManager(cfg)
    hang_at(api, 250)
    try:
        await first.start("news")
        await api.wait_for_requests(3)
        with pytest.raises(JobRunning) as caught:
            await second.start("news")
        message = str(caught.value)
        assert f"job 'news' is already running in pid {os.getpid()} on host " \
               f"{socket.gethostname()} since " in message
        assert "UTC" in message and "lease expires at" in message
        status = await second.status("news")
        assert status["state"] == "running" and status["runner"]["pid"] == os.getpid()
        assert [j["state"] for j in await second.list()] == ["running"]
        app = FastAPI()
        errors.install(app)
        app.include_router(router)
        app.state.services = SimpleNamespace(jobs=second, control=None)
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                      base_url="http://test") as client:
            resp = await client.post("/jobs/news/start")
        assert resp.status_code == 409
        assert "is already running in pid" in resp.json()["detail"]
    finally:
        await first.close()
        await second.close()
    assert not second.running("news")


async def test_the_cli_refuses_a_job_the_server_is_running(tmp_path: Path, api: ApiServer) -> None:
    cfg_path = write_config(tmp_path, api.url)
    manager = CollectJobManager(load(cfg_path))
    hang_at(api, 250)
    try:
        await manager.start("news")
        await api.wait_for_requests(3)
        seen = len(api.log)
        code, out, err = await finish(await start_cli(cfg_path))
    finally:
        await manager.close()
    assert code == 3, err
    assert f"is already running in pid {os.getpid()} on host" in " ".join(err.split())
    assert len(api.log) == seen  # the refused run sent nothing


async def test_the_server_sees_stops_and_reads_the_log_of_a_cli_run(
    tmp_path: Path, api: ApiServer
) -> None:
    cfg_path = write_config(tmp_path, api.url)
    manager = CollectJobManager(load(cfg_path))
    hang_at(api, 150)
    proc = await start_cli(cfg_path, "--lease-ttl", "0.6")
    try:
        await api.wait_for_requests(4)  # total, 350, 250, then 150 hangs
        with pytest.raises(JobRunning, match=f"in pid {proc.pid} on host"):
            await manager.start("news")
        status = await manager.status("news")
        assert status["state"] == "running" and status["runner"]["pid"] == proc.pid

        async def shipped() -> list[str] | None:  # the CLI ships its lines every 0.5 s
            lines = await manager.log("news")
            return lines if any("batch delivered" in line for line in lines) else None

        lines = await wait_for(shipped, "the CLI run's log lines in the store")
        assert any("incremental plan" in line for line in lines)
        assert await manager.stop("news")  # through the lease: the CLI's heartbeat
        code, out, _ = await finish(proc)
        status = await manager.status("news")
    finally:
        await manager.close()
    assert code == 130 and '"CANCELLED"' in out
    assert status["state"] == "idle"
    assert status["last_result"]["status"] == "CANCELLED"
    assert "stopped by request" in status["last_result"]["reason"]
    assert any("run finished" in line for line in status["log"])


async def test_a_run_killed_with_sigkill_does_not_block_the_next_one(
    tmp_path: Path, api: ApiServer
) -> None:
    cfg_path = write_config(tmp_path, api.url)
    hang_at(api, 150)
    proc = await start_cli(cfg_path)  # the default 30 s lease
    await api.wait_for_requests(4)
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    api.clear_faults()
    manager = CollectJobManager(load(cfg_path))
    try:
        await manager.start("news")  # same host, dead pid: taken over at once
        result = await manager.wait("news")
        runs = await (await manager.store()).runs("news")
    finally:
        await manager.close()
    assert result is not None and result.status.value == "SUCCEEDED"
    assert [r.status for r in runs] == ["SUCCEEDED", "CRASHED"]


# ---- the lease itself, on virtual time --------------------------------------------------------
async def test_a_lease_of_another_host_blocks_until_it_expires(store: SqlMetadataStore) -> None:
    clock = FakeClock(1000.0)
    there = RunLease(store, "news", "r1", ttl=30, clock=clock, pid=1, host="other-host")
    await there.acquire()
    clock.advance(29)
    here = RunLease(store, "news", "r2", ttl=30, clock=clock)
    with pytest.raises(JobRunning, match="in pid 1 on host other-host"):
        await here.acquire()
    clock.advance(1)
    assert (await here.acquire()).run_id == "r2"


async def test_a_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(
    store: SqlMetadataStore,
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    clock = FakeClock(1000.0)
    await RunLease(store, "news", "r1", clock=clock, pid=dead.pid).acquire()
    assert (await RunLease(store, "news", "r2", clock=clock).acquire()).run_id == "r2"


async def test_a_heartbeat_renews_and_delivers_a_stop_request(store: SqlMetadataStore) -> None:
    clock = FakeClock(1000.0)
    lease, token = RunLease(store, "news", "r1", ttl=30, clock=clock), CancellationToken()
    await lease.acquire()
    clock.advance(20)
    await lease.beat(token)
    assert lease.current is not None and lease.current.expires_at == clock() + 30
    assert not token.is_cancelled
    await store.request_stop("news", "stopped by request (from pid 9)")
    await lease.beat(token)
    assert token.is_cancelled and token.reason == "stopped by request (from pid 9)"
    await lease.release()
    assert await store.lease("news") is None


async def test_a_run_that_lost_its_lease_stops(store: SqlMetadataStore) -> None:
    clock = FakeClock(1000.0)
    lease, token = RunLease(store, "news", "r1", ttl=30, clock=clock), CancellationToken()
    await lease.acquire()
    clock.advance(31)  # it stalled: the lease expired and another runner took it
    await RunLease(store, "news", "r2", ttl=30, clock=clock, host="other").acquire()
    await lease.beat(token)
    assert token.is_cancelled and "lost" in str(token.reason)
    await lease.release()  # does not free the new holder's lease
    assert (await store.lease("news")) is not None


async def test_a_run_stops_when_the_store_is_out_of_reach_for_a_whole_ttl(
    tmp_path: Path,
) -> None:
    from crawlhub.collect.store import open_metadata_store

    store = await open_metadata_store(f"sqlite:///{tmp_path}/meta.db")
    clock = FakeClock(1000.0)
    lease, token = RunLease(store, "news", "r1", ttl=30, clock=clock), CancellationToken()
    await lease.acquire()
    await store.close()  # out of reach from now on
    clock.advance(10)
    await lease.beat(token)
    assert not token.is_cancelled  # one missed renewal is not fatal
    clock.advance(20)
    await lease.beat(token)
    assert token.is_cancelled and "unreachable" in str(token.reason)


async def test_auto_start_leaves_a_job_running_elsewhere_to_that_run(
    tmp_path: Path, api: ApiServer
) -> None:
    cfg = load(write_config(tmp_path, api.url))
    cfg.jobs[0].auto_start = True
    first, second = CollectJobManager(cfg), CollectJobManager(cfg)
    hang_at(api, 250)
    try:
        assert len(await first.start_auto()) == 1
        await api.wait_for_requests(3)
        assert await second.start_auto() == []  # a second server starts cleanly
        assert not second.running("news")
    finally:
        await first.close()
        await second.close()


async def test_api_job_log_shows_the_lines_of_a_run_from_another_manager(
    tmp_path: Path, api: ApiServer
) -> None:
    cfg = load(write_config(tmp_path, api.url))
    runner, server = CollectJobManager(cfg), CollectJobManager(cfg)
    app = FastAPI()
    errors.install(app)
    app.include_router(router)
    app.state.services = SimpleNamespace(jobs=server, control=None)
    try:
        await runner.start("news")
        await runner.wait("news")
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                      base_url="http://test") as client:
            resp = await client.get("/jobs/news/log", params={"lines": 3})
            missing = await client.get("/jobs/nope/log")
    finally:
        await runner.close()
        await server.close()
    assert resp.status_code == 200
    lines = resp.json()["lines"]
    assert len(lines) == 3 and "run finished" in lines[-1]
    assert missing.status_code == 404

"""A job's env cannot load code into its processes: every dynamic-loader variable
(``LD_*``: LD_AUDIT was accepted and ld.so tried to load it) and the startup hooks of
Python, Perl, Ruby, Node, the JVM and the shells are 422 on create, change, run and
restart, naming the variable and the fix, unless ``control.allowed_env`` lists them."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.control.channel import ControlChannel
from crawlhub.control.db import ControlDB
from crawlhub.control.jobs import JobService, JobSpec, JobStore, Runner
from crawlhub.services import Services
from tests.helpers import wait_for

Client = tuple[httpx2.AsyncClient, Services]
MakeClient = Callable[..., Awaitable[Client]]

#: prints the names of its environment's LD_A* and PYTHONINSPECT variables
ECHO = [sys.executable, "-c", "import os; print(sorted(k for k in os.environ"
        " if k.startswith(('LD_A', 'PYTHONINSPECT'))))"]


@pytest.fixture
async def make_client(tmp_path: Path) -> AsyncIterator[MakeClient]:
    opened: list[Services] = []
    clients: list[httpx2.AsyncClient] = []

    async def make(**control: Any) -> Client:
        config = CrawlhubConfig.model_validate({
            "data_dir": str(tmp_path), "control": {"grace": 1, **control},
            "outbound": [{"name": "default", "init": {"key": "default"}}]})
        svc = await Services.open(config)
        opened.append(svc)
        await svc.start()  # the log store's flush task among the rest
        client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=create_app(services=svc)),
                                    base_url="http://test")
        clients.append(client)
        return client, svc

    yield make
    for client in clients:
        await client.aclose()
    for svc in opened:
        await svc.close()


def job(name: str, **env: str) -> dict[str, Any]:
    return {"name": name, "command": ECHO, "env": env}


@pytest.mark.parametrize("name", [
    "LD_AUDIT", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_DEBUG_OUTPUT", "LD_PROFILE",
    "ld_audit", "DYLD_INSERT_LIBRARIES", "GCONV_PATH", "GLIBC_TUNABLES",
    "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONBREAKPOINT", "PYTHONHOME", "PYTHONUSERBASE",
    "PERL5OPT", "RUBYOPT", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "BASH_ENV", "ENV",
    "SHELLOPTS", "PS4"])
async def test_a_job_env_that_loads_code_is_refused_with_the_name_and_the_fix(
        make_client: MakeClient, name: str) -> None:
    client, _ = await make_client()
    r = await client.post("/jobs/", json=job("hooked", **{name: "/tmp/x.so"}))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert repr(name) in detail and f"control.allowed_env: [{name}]" in detail
    assert (await client.get("/jobs/hooked")).status_code == 404


async def test_a_change_that_adds_a_loader_variable_is_refused(
        make_client: MakeClient) -> None:
    client, _ = await make_client()
    assert (await client.post("/jobs/", json=job("plain"))).status_code == 201
    r = await client.patch("/jobs/plain", json={"env": {"LD_AUDIT": "/tmp/audit.so"}})
    assert r.status_code == 422 and "'LD_AUDIT'" in r.json()["detail"], r.text
    assert (await client.get("/jobs/plain")).json()["spec"]["env"] == {}


async def test_ordinary_variables_and_pythonpath_are_taken(make_client: MakeClient) -> None:
    client, _ = await make_client()
    env = {"PYTHONPATH": os.pathsep.join(sys.path), "LANG": "C.UTF-8", "LOAD_X": "1",
           "PYTHONWARNINGS": "ignore", "NODE_PATH": "/srv/node", "MY_LD_PRELOAD": "1"}
    r = await client.post("/jobs/", json=job("ordinary", **env))
    assert r.status_code == 201, r.text


async def test_a_stored_job_with_a_loader_variable_does_not_run(
        make_client: MakeClient) -> None:
    """A job stored before the check (or allowed by an older config) is refused when it
    would run: no process is started."""
    client, svc = await make_client()
    assert svc.control is not None
    spec = JobSpec(name="old", command=ECHO, env={"LD_AUDIT": "/tmp/audit.so"})
    await svc.control.jobs.store.create(spec, time.time())
    for path in ("/jobs/old/run", "/jobs/old/restart"):
        r = await client.post(path)
        assert r.status_code == 422 and "'LD_AUDIT'" in r.json()["detail"], r.text
    assert (await client.get("/runs/", params={"job": "old"})).json() == []


async def test_a_cron_tick_of_such_a_stored_job_is_skipped_saying_why(tmp_path: Path) -> None:
    db = await ControlDB.open(f"sqlite:///{tmp_path}/control.db")
    channel = ControlChannel(db)
    await channel.open()
    now = [1_700_000_000.0]
    runner = Runner(JobStore(db), channel=channel, runs_dir=tmp_path / "runs", grace=1.0)
    jobs = JobService(runner.store, runner, clock=lambda: now[0])
    await jobs.open()
    try:
        spec = JobSpec(name="nightly", command=ECHO, cron="*/5 * * * *",
                       env={"PYTHONSTARTUP": "/tmp/x.py"})
        await jobs.store.create(spec, now[0])  # as an older server stored it
        now[0] = 1_700_000_100.5  # the first tick is due
        assert await jobs.cron.tick() == ["nightly"]
        runs = await jobs.store.list_runs(job="nightly")
        assert [r.status for r in runs] == ["skipped"]
        assert "'PYTHONSTARTUP' is refused" in (runs[0].error or "")
        assert "control.allowed_env" in (runs[0].error or "")
    finally:
        await jobs.close()
        await channel.close()
        await db.close()


async def test_the_config_can_allow_a_variable_and_the_job_gets_it(
        make_client: MakeClient) -> None:
    client, _ = await make_client(allowed_env=["PYTHONINSPECT"])
    r = await client.post("/jobs/", json=job("inspect", PYTHONINSPECT=""))
    assert r.status_code == 201, r.text
    r = await client.post("/jobs/", json=job("audit", LD_AUDIT="/tmp/audit.so"))
    assert r.status_code == 422  # only what is listed
    run_id = (await client.post("/jobs/inspect/run")).json()["run_id"]

    async def ended() -> dict[str, Any] | None:
        run = (await client.get(f"/runs/{run_id}")).json()["run"]
        return run if run["status"] not in ("queued", "running") else None

    assert (await wait_for(ended, timeout=20))["status"] == "succeeded"

    async def logged() -> bool:
        lines = (await client.get("/logs", params={"run": run_id})).json()["lines"]
        return "['PYTHONINSPECT']" in str(lines)

    await wait_for(logged, "the job's line naming the variable it got", timeout=20)


def test_the_allow_list_takes_only_variable_names() -> None:
    with pytest.raises(ValueError, match="not an environment variable name"):
        CrawlhubConfig.model_validate({"control": {"allowed_env": ["LD_*"]}})

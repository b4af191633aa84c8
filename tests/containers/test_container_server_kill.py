"""``crawlhub serve`` SIGKILLed while container jobs run, one of them frozen by the
engine's pause. Restarted on the same data, the server finds their containers by label,
stops and removes them, and records each run ``lost`` saying what happened to its
container: no run stays ``running``, no container is left behind, and the job runs again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.serving import crawlhub_serve
from tests.containers.engine import containers_of, py, state_of
from tests.control.served_api import call
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

TICKER = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.1)\n"


async def test_a_server_killed_under_running_and_frozen_containers_stops_them_on_restart(
        tmp_path: Path, base_image: str) -> None:
    args = ["--data-dir", str(tmp_path / "data")]
    log = tmp_path / "serve.log"
    runs = {}
    with crawlhub_serve(args, log=log) as served:
        for name, pause in (("running", False), ("frozen", True)):
            call(served, "POST", "/jobs/", {"name": name, "runtime": "container",
                                           "image": base_image, "pause_signal": pause,
                                           "command": py(TICKER)})
            runs[name] = call(served, "POST", f"/jobs/{name}/run")["run_id"]
        await wait_for(lambda: all(state_of(run) == "running" for run in runs.values()),
                       "both containers to run")
        call(served, "POST", "/jobs/frozen/pause")
        await wait_for(lambda: state_of(runs["frozen"]) == "paused", "the engine's pause")
        served.kill()
    assert state_of(runs["running"]) == "running", "a killed server's container runs on"
    with crawlhub_serve(args, log=log) as served:
        for name, run_id in runs.items():
            run = call(served, "GET", f"/runs/{run_id}")["run"]
            assert run["status"] == "lost", run
            assert "stopped the container and removed it" in run["error"], run
            assert containers_of(run_id) == [], f"the {name} run's container is gone"
        call(served, "POST", "/jobs/frozen/continue")
        again = call(served, "POST", "/jobs/frozen/run")["run_id"]
        await wait_for(lambda: state_of(again) == "running", "the job to run again")
        call(served, "POST", "/jobs/frozen/cancel")
        await wait_for(lambda: call(served, "GET", f"/runs/{again}")["run"]["status"]
                       == "cancelled", "the new run to end")
    assert containers_of(again) == []

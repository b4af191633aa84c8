"""``crawlhub serve`` killed with SIGKILL while a job runs, paused or counting, at a
random point after the run starts. Restarted on the same data, the server still has the
job and its desired state, records the run ``lost``, stops the job process the killed
server left behind (a paused one would otherwise wait forever, unsupervised), and runs
the job again: nothing is wedged."""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pytest

from tests.cli.serving import crawlhub_serve
from tests.control.served_api import call
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

ITEM_JOB = Path(__file__).with_name("item_job.py")


def processes_of(run_id: str) -> list[int]:
    """This user's live processes started for ``run_id`` (by their environment)."""
    mark = f"CRAWLHUB_RUN={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark in environ:
                found.append(int(entry))
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("paused", [True, False], ids=["paused", "counting"])
async def test_a_server_killed_under_a_running_job_leaves_no_orphan_and_no_wedge(
        tmp_path: Path, paused: bool) -> None:
    seed = int(os.environ.get("CRAWLHUB_TEST_SEED") or time.time_ns() % 100_000)
    kill_after = random.Random(seed).uniform(0.0, 1.5)
    print(f"seed {seed}: SIGKILL {kill_after:.2f} s after the run starts")
    args = ["--data-dir", str(tmp_path / "data")]
    log = tmp_path / "serve.log"
    with crawlhub_serve(args, log=log) as served:
        call(served, "POST", "/jobs/", {
            "name": "counting", "command": [sys.executable, str(ITEM_JOB), "100000", "0.05"]})
        if paused:
            call(served, "POST", "/jobs/counting/pause")
        run_id = call(served, "POST", "/jobs/counting/run")["run_id"]
        time.sleep(kill_after)
        served.kill()
    survivors = processes_of(run_id)
    print(f"job processes alive after the kill: {survivors}")

    with crawlhub_serve(args, log=log) as served:
        run = call(served, "GET", f"/runs/{run_id}")["run"]
        assert run["status"] == "lost", run
        if paused and survivors:  # a paused job writes nothing: it cannot die by itself
            assert "left running was stopped" in run["error"], run
        # a counting one dies of its next write to the killed server's pipe (EPIPE), or
        # is stopped, whichever comes first
        await wait_for(lambda: not processes_of(run_id), "the orphan to be gone", timeout=30)
        job = call(served, "GET", "/jobs/counting")
        assert job["desired"] == ("pause" if paused else "run")
        if paused:
            call(served, "POST", "/jobs/counting/continue")
        again = call(served, "POST", "/jobs/counting/run")["run_id"]

        def counted() -> int:
            queue = call(served, "GET", "/jobs/counting/queue")
            return int(queue["success"] or 0) if queue["run"] == again else 0

        await wait_for(lambda: counted() > 3, "the new run to count", timeout=30)
        call(served, "POST", "/jobs/counting/cancel")
        await wait_for(lambda: call(served, "GET", f"/runs/{again}")["run"]["status"]
                       == "cancelled", "the new run to end", timeout=30)
    assert not processes_of(again)

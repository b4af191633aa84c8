"""Container jobs on the real engine (podman): output into the log store by stream,
exit codes, env (the job's and the protocol's, never the server's), labels, the
read-only root with a writable /tmp and run volume, the SDK's counters and pause, the
engine's pause for a job that never heard of crawlhub, cancel (SIGTERM, then SIGKILL),
OOM kills, restart, and a container that vanishes under its run."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from crawlhub.control.jobs import JobService, JobSpec
from crawlhub.control.jobs.container import LABEL_JOB, LABEL_RUN, LABEL_SERVER, container_name
from crawlhub.control.jobs.model import JobEnvError
from crawlhub.control.jobs.store import HOST
from tests.containers.baseimage import ENGINE
from tests.containers.engine import containers_of, py, state_of
from tests.helpers import wait_for

COUNTER = textwrap.dedent("""
    import time
    from crawlhub import sdk
    n = 0
    control = sdk.control()
    while control.wait_while_paused():
        n += 1
        sdk.set_counter("success", n)
        print("tick", n, flush=True)
        time.sleep(0.05)
    sdk.flush()
    print("exit asked at", n, flush=True)
""")
#: prints a tick every 50 ms and knows nothing of crawlhub
PLAIN_TICKER = "import time\nn = 0\nwhile True:\n    n += 1\n    print('tick', n, flush=True)\n    time.sleep(0.05)\n"


def sink_of(jobs: JobService) -> list[str]:
    return jobs.sink.text()  # type: ignore[attr-defined, no-any-return]


def lines_of(jobs: JobService, run: str, stream: str | None = None) -> list[str]:
    return jobs.sink.text(run, stream)  # type: ignore[attr-defined, no-any-return]


async def test_a_container_job_streams_its_output_by_stream_and_passes_its_exit_code(
        container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="hello", runtime="container", command=py(
        "import sys; print('to out'); print('to err', file=sys.stderr); sys.exit(3)")))
    run = await container_jobs.run("hello")
    done = await container_jobs.runner.wait(run.id)
    assert (done.status, done.exit_code) == ("failed", 3), done
    assert "to out" in lines_of(container_jobs, run.id, "stdout")
    assert "to err" in lines_of(container_jobs, run.id, "stderr")
    assert containers_of(run.id) == [], "the run's container is removed at its end"


async def test_a_container_gets_the_jobs_env_and_the_protocols_but_never_the_servers(
        container_jobs: JobService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVER_ONLY_SECRET", "s3cret")
    await container_jobs.create(JobSpec(name="env", runtime="container", env={"GREETING": "hi"},
                                        command=py("import os; print(sorted(os.environ))\n"
                                                   "print(os.environ['GREETING'])")))
    run = await container_jobs.run("env")
    assert (await container_jobs.runner.wait(run.id)).status == "succeeded"
    out = lines_of(container_jobs, run.id, "stdout")
    assert "hi" in out
    assert "CRAWLHUB_RUN" in out[0] and "SERVER_ONLY_SECRET" not in out[0], out


async def test_a_container_jobs_env_is_refused_like_a_process_jobs(
        container_jobs: JobService) -> None:
    with pytest.raises(JobEnvError, match="LD_PRELOAD"):
        await container_jobs.create(JobSpec(name="preload", runtime="container",
                                            env={"LD_PRELOAD": "/tmp/x.so"}, command=py("1")))


async def test_a_running_container_carries_the_job_run_and_server_labels(
        container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="labelled", runtime="container",
                                        command=py(PLAIN_TICKER)))
    run = await container_jobs.run("labelled")
    await wait_for(lambda: lines_of(container_jobs, run.id, "stdout"), "the first tick")
    (found,) = containers_of(run.id)
    assert found["Labels"][LABEL_JOB] == "labelled"
    assert found["Labels"][LABEL_RUN] == run.id
    assert found["Labels"][LABEL_SERVER] == f"{HOST}:{os.getpid()}"
    assert container_name(run.id) in found["Names"]
    await container_jobs.cancel("labelled")
    assert (await container_jobs.runner.wait(run.id)).status == "cancelled"


async def test_the_root_is_read_only_and_tmp_and_the_run_volume_are_writable(
        container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="fs", runtime="container", command=py(
        "import os\n"
        "try:\n    open('/usr/evil', 'w')\nexcept OSError as e:\n    print('root:', e.errno)\n"
        "open('/tmp/scratch', 'w').write('t')\n"
        "open('/crawlhub/run/result.txt', 'w').write('kept')\nprint('written')")))
    run = await container_jobs.run("fs")
    assert (await container_jobs.runner.wait(run.id)).status == "succeeded"
    out = lines_of(container_jobs, run.id, "stdout")
    assert "root: 30" in out and "written" in out, out  # EROFS
    volume = container_jobs.runner.runs_dir / run.id / "result.txt"
    assert volume.read_text() == "kept"


async def test_a_container_job_on_the_sdk_counts_and_pauses_cooperatively(
        container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="counter", runtime="container",
                                        command=py(COUNTER)))
    run = await container_jobs.run("counter")

    async def success() -> int:
        return int((await container_jobs.queue("counter")).success or 0)

    async def counted() -> bool:
        return await success() >= 3

    await wait_for(counted, "the job's counters through the run volume")
    await container_jobs.pause("counter")

    async def paused() -> str | None:
        return (await container_jobs.store.run(run.id)).paused

    await wait_for(paused, "the pause to take effect")
    assert await paused() == "cooperative"
    await container_jobs.resume("counter")

    async def going() -> bool:
        return await paused() is None and await success() > 3

    await wait_for(going, "the run going on after continue")
    await container_jobs.cancel("counter")
    done = await container_jobs.runner.wait(run.id)
    assert done.status == "cancelled"
    assert any(line.startswith("exit asked at") for line in lines_of(container_jobs, run.id)), \
        "the SDK saw exit in its control file and ended by itself"


async def test_a_job_that_never_heard_of_crawlhub_is_frozen_by_the_engine_and_thawed(
        container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="plain", runtime="container", pause_signal=True,
                                        command=py(PLAIN_TICKER)))
    run = await container_jobs.run("plain")
    await wait_for(lambda: len(lines_of(container_jobs, run.id)) >= 2, "ticks")
    await container_jobs.pause("plain")

    async def frozen() -> bool:
        return (await container_jobs.store.run(run.id)).paused == "frozen"

    await wait_for(frozen, "the engine's pause")
    assert state_of(run.id) == "paused"
    seen = len(lines_of(container_jobs, run.id, "stdout"))
    # frozen: no tick gets out while the engine says paused (checked over the time of
    # several ticks, the container's own clock being frozen with it)
    await wait_for(lambda: state_of(run.id) == "paused", "still paused")
    assert len(lines_of(container_jobs, run.id, "stdout")) <= seen + 1
    await container_jobs.resume("plain")
    await wait_for(lambda: len(lines_of(container_jobs, run.id, "stdout")) > seen + 2,
                   "ticks again after continue")
    await container_jobs.cancel("plain")
    assert (await container_jobs.runner.wait(run.id)).status == "cancelled"


async def test_cancel_stops_with_sigterm_and_kills_a_container_that_ignores_it(
        container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="stubborn", runtime="container", grace=1, command=py(
        "import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: print('TERM ignored',"
        " flush=True))\nprint('up', flush=True)\nwhile True:\n    time.sleep(0.05)")))
    run = await container_jobs.run("stubborn")
    await wait_for(lambda: "up" in lines_of(container_jobs, run.id), "the job to start")
    await container_jobs.cancel("stubborn")
    done = await container_jobs.runner.wait(run.id)
    assert done.status == "cancelled"
    assert "TERM ignored" in lines_of(container_jobs, run.id)
    assert any("SIGKILL" in line for line in lines_of(container_jobs, run.id))
    assert containers_of(run.id) == []


async def test_an_oom_kill_is_recorded_as_such_on_the_run(container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="hungry", runtime="container", memory="48m",
                                        command=py("x = bytearray(400 * 1024 * 1024)")))
    run = await container_jobs.run("hungry")
    done = await container_jobs.runner.wait(run.id)
    assert (done.status, done.exit_code) == ("failed", 137), done
    assert done.error is not None and "OOM-killed" in done.error and "48m" in done.error, done


async def test_restart_replaces_the_container_with_a_fresh_one(
        container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="again", runtime="container",
                                        command=py(PLAIN_TICKER)))
    first = await container_jobs.run("again")
    await wait_for(lambda: lines_of(container_jobs, first.id), "the first run's ticks")
    second = await container_jobs.restart("again")
    assert (await container_jobs.store.run(first.id)).status == "cancelled"
    assert containers_of(first.id) == []
    await wait_for(lambda: state_of(second.id) == "running", "the new container")
    assert second.trigger == "restart"
    await container_jobs.cancel("again")
    await container_jobs.runner.wait(second.id)


async def test_a_container_removed_under_its_run_ends_the_run_lost_with_a_reason(
        container_jobs: JobService) -> None:
    await container_jobs.create(JobSpec(name="vanishing", runtime="container",
                                        command=py(PLAIN_TICKER)))
    run = await container_jobs.run("vanishing")
    await wait_for(lambda: lines_of(container_jobs, run.id), "ticks")
    subprocess.run([ENGINE, "rm", "-f", "-t", "0", container_name(run.id)], check=True,
                   capture_output=True)
    done = await container_jobs.runner.wait(run.id)
    assert done.status == "lost", done
    assert done.error is not None and "vanished" in done.error, done


async def test_a_job_in_a_container_with_no_image_anywhere_fails_saying_what_to_give(
        container_jobs: JobService, tmp_path: Path) -> None:
    container_jobs.runner.runtimes["container"].default_image = None  # type: ignore[attr-defined]
    await container_jobs.create(JobSpec(name="imageless", runtime="container", command=py("1")))
    run = await container_jobs.run("imageless")
    done = await container_jobs.runner.wait(run.id)
    assert done.status == "failed"
    assert done.error is not None and "names no image" in done.error, done

"""Jobs of every kind: the store on SQLite and PostgreSQL, the runner on real
subprocesses (logs, task timeline, counters, exit codes, cancel with SIGTERM then
SIGKILL, timeout, pause and continue, restart), max_instances, cron with an injected
clock, and runs left by a killed server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pydantic
import pytest

from crawlhub.control.channel import ControlChannel
from crawlhub.control.db import ControlDB
from crawlhub.control.jobs import JobPatch, JobService, JobSpec, JobStore, Runner
from crawlhub.control.jobs.cron import CronScheduler
from crawlhub.control.jobs.model import LIVE
from crawlhub.control.jobs.store import HOST
from crawlhub.control.logs.line import LogLine
from crawlhub.core import jobprotocol as protocol
from crawlhub.core.errors import ConflictError, NotFoundError
from tests.helpers import wait_for

COUNTER = textwrap.dedent("""
    import sys, time
    from crawlhub import sdk
    n = 0
    with sdk.task("count"):
        while n < int(sys.argv[1]):
            if not sdk.control().wait_while_paused():
                print("exit requested at", n, flush=True)
                break
            n += 1
            sdk.set_counter("success", n)
            sdk.set_counter("total", int(sys.argv[1]))
            time.sleep(0.02)
    sdk.flush()
    print("counted", n, flush=True)
""")


class Sink:
    """The lines a runner writes (the log store's input)."""

    def __init__(self) -> None:
        self.lines: list[LogLine] = []

    async def __call__(self, batch: list[LogLine]) -> None:
        self.lines.extend(batch)

    def text(self) -> list[str]:
        return [line.message for line in self.lines]


@pytest.fixture
async def jobs(control_db: ControlDB, tmp_path: Path) -> AsyncIterator[JobService]:
    channel = ControlChannel(control_db)
    await channel.open()
    sink = Sink()
    runner = Runner(JobStore(control_db), channel=channel, runs_dir=tmp_path / "runs",
                    grace=1.0, beat=0.2, log_sink=sink)
    service = JobService(runner.store, runner)
    service.sink = sink  # type: ignore[attr-defined]
    await service.open()
    yield service
    await service.close()
    await channel.close()


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def counter(tmp_path: Path, n: int) -> JobSpec:
    """Job ``count``: COUNTER counting to ``n`` with crawlhub.sdk importable."""
    path = script(tmp_path, "count.py", COUNTER)
    return JobSpec(name="count", command=[sys.executable, path, str(n)],
                   env={"PYTHONPATH": os.pathsep.join(sys.path)})


async def finished(jobs: JobService, run_id: str, timeout: float = 15.0) -> str:
    run = await asyncio.wait_for(jobs.runner.wait(run_id), timeout)
    return run.status


async def test_jobs_are_created_listed_changed_and_removed(jobs: JobService) -> None:
    await jobs.create(JobSpec(name="b-job", command=["true"], cron="*/5 * * * *"))
    await jobs.create(JobSpec(name="a-job", command=["true"], notes="first"))
    with pytest.raises(ConflictError, match="exists"):
        await jobs.create(JobSpec(name="a-job", command=["true"]))
    views = await jobs.list_jobs()
    assert [v.spec.name for v in views] == ["a-job", "b-job"]
    assert views[1].next_fire is not None and views[1].next_fire % 300 == 0
    assert [v.spec.name for v in await jobs.list_jobs(after="a-job")] == ["b-job"]
    changed = await jobs.update("a-job", JobPatch(cron="0 3 * * *", max_instances=2))
    assert changed.spec.cron == "0 3 * * *" and changed.spec.max_instances == 2
    assert changed.spec.notes == "first" and changed.next_fire is not None
    await jobs.delete("b-job")
    with pytest.raises(NotFoundError):
        await jobs.get("b-job")
    with pytest.raises(NotFoundError):
        await jobs.delete("b-job")


@pytest.mark.parametrize("bad, why", [
    ({"name": "../x", "command": ["true"]}, "name"),
    ({"name": "x", "command": ["true"], "cron": "61 * * * *"}, "cron"),
    ({"name": "x", "command": ["true"], "timezone": "Mars/Olympus"}, "timezone"),
    ({"name": "x", "command": ["true"], "env": {"CRAWLHUB_RUN": "r"}}, "set by the runner"),
    ({"name": "x", "command": ["a\x00b"]}, "NUL"),
    ({"name": "x", "command": ["true"], "max_instances": 0}, "max_instances"),
    ({"name": "x", "command": ["true"], "shell": "rm -rf /"}, "shell"),
])
def test_a_bad_job_is_refused_with_the_reason(bad: dict[str, object], why: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=why):
        JobSpec.model_validate(bad)


async def test_a_run_records_exit_logs_timeline_and_counters(jobs: JobService,
                                                             tmp_path: Path) -> None:
    await jobs.create(counter(tmp_path, 5))
    run = await jobs.run("count")
    assert run.status == "running" and run.host == HOST
    assert await finished(jobs, run.id) == "succeeded"
    view = await jobs.run_view(run.id)
    assert view.run.exit_code == 0 and view.run.finished_at is not None
    assert view.run.counters["success"] == 5
    assert view.queue is not None and view.queue.success == 5 and view.queue.left == 0
    assert [(t.task, t.status) for t in view.tasks] == [("count", "succeeded")]
    lines = jobs.sink.lines  # type: ignore[attr-defined]
    said = [line for line in lines if line.message == "counted 5"]
    assert said and said[0].job == "count" and said[0].run == run.id
    assert said[0].stream == "stdout"
    assert any(line.task == "count" for line in lines)


async def test_a_relative_runs_dir_reaches_the_job_as_an_absolute_path(
        control_db: ControlDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``crawlhub serve --data-dir data`` gives the runner a relative runs dir; the job
    runs in another directory, so its control and counters files must be absolute or
    it never sees a pause and its counters are lost."""
    monkeypatch.chdir(tmp_path)
    channel = ControlChannel(control_db)
    await channel.open()
    runner = Runner(JobStore(control_db), channel=channel, runs_dir="data/runs", beat=0.2)
    service = JobService(runner.store, runner)
    await service.open()
    try:
        await service.create(counter(tmp_path, 5))
        run = await service.run("count")
        monkeypatch.chdir("/")
        assert await finished(service, run.id) == "succeeded"
        assert (await service.run_view(run.id)).run.counters["success"] == 5
    finally:
        await service.close()
        await channel.close()


async def test_a_failing_or_missing_program_fails_with_the_reason(jobs: JobService,
                                                                 tmp_path: Path) -> None:
    path = script(tmp_path, "fail.py", """
        import sys
        print("ERROR something broke", file=sys.stderr)
        sys.exit(3)
    """)
    await jobs.create(JobSpec(name="fail", command=[sys.executable, path]))
    run = await jobs.run("fail")
    assert await finished(jobs, run.id) == "failed"
    record = await jobs.store.run(run.id)
    assert record.exit_code == 3 and "code 3" in (record.error or "")
    errors = [line for line in jobs.sink.lines if line.level == "error"]  # type: ignore[attr-defined]
    assert errors and errors[0].stream == "stderr"
    await jobs.create(JobSpec(name="ghost", command=["no-such-program-here"]))
    run = await jobs.run("ghost")
    assert await finished(jobs, run.id) == "failed"
    assert "not on PATH" in ((await jobs.store.run(run.id)).error or "")


async def test_max_instances_refuses_a_second_run_and_cancel_escalates_to_sigkill(
        jobs: JobService, tmp_path: Path) -> None:
    path = script(tmp_path, "stubborn.py", """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
        print("started", flush=True)
        time.sleep(60)
    """)
    await jobs.create(JobSpec(name="stubborn", command=[sys.executable, path]))
    run = await jobs.run("stubborn")
    with pytest.raises(ConflictError, match="max_instances is 1"):
        await jobs.run("stubborn")
    await wait_for(lambda: "started" in jobs.sink.text(), timeout=10)  # type: ignore[attr-defined]
    asked = await jobs.cancel("stubborn")
    assert asked == [run.id]
    assert await finished(jobs, run.id) == "cancelled"
    text = jobs.sink.text()  # type: ignore[attr-defined]
    assert "ignoring SIGTERM" in text
    assert any("SIGKILL" in line for line in text)
    record = await jobs.store.run(run.id)
    assert record.exit_code == -9
    # the exit request was for those runs only: the next run is not asked to exit
    assert await jobs.channel.get("stubborn") == protocol.RUN


async def test_a_run_over_its_timeout_ends_as_timeout(jobs: JobService, tmp_path: Path) -> None:
    path = script(tmp_path, "slow.py", "import time\ntime.sleep(60)\n")
    await jobs.create(JobSpec(name="slow", command=[sys.executable, path], timeout=0.5))
    run = await jobs.run("slow")
    assert await finished(jobs, run.id) == "timeout"
    assert "timeout" in ((await jobs.store.run(run.id)).error or "")


async def test_pause_holds_a_counting_job_and_continue_resumes_it(jobs: JobService,
                                                                 tmp_path: Path) -> None:
    await jobs.create(counter(tmp_path, 100000))
    run = await jobs.run("count")
    counters = tmp_path / "runs" / run.id / "counters.json"

    def counted() -> int:
        data = protocol.read_json(counters) or {}
        return int(data.get("counters", {}).get("success", 0))

    await wait_for(lambda: counted() > 5, timeout=10)
    view = await jobs.pause("count")
    assert view.desired == protocol.PAUSE
    await asyncio.sleep(1.5)  # the pause has taken effect (within a second)
    held = counted()
    await asyncio.sleep(1.0)
    assert counted() == held, "a paused job went on counting"
    await jobs.resume("count")
    await wait_for(lambda: counted() > held + 5, timeout=10)
    await jobs.cancel("count")
    assert await finished(jobs, run.id) == "cancelled"


async def test_a_paused_job_starts_its_next_run_paused(jobs: JobService,
                                                      tmp_path: Path) -> None:
    await jobs.create(counter(tmp_path, 3))
    await jobs.pause("count")
    run = await jobs.run("count")
    control = tmp_path / "runs" / run.id / "control.json"
    # written before the process starts, so it never runs a step unpaused
    await wait_for(lambda: protocol.read_json(control), timeout=10)
    assert (protocol.read_json(control) or {}).get("state") == protocol.PAUSE
    await asyncio.sleep(1.0)
    assert (await jobs.store.run(run.id)).status == "running"
    await jobs.resume("count")
    assert await finished(jobs, run.id) == "succeeded"


async def test_pause_signal_stops_a_job_without_the_sdk(jobs: JobService,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "ticks.txt"
    path = script(tmp_path, "ticks.py", f"""
        import time
        with open({str(out)!r}, "a") as f:
            while True:
                f.write("x"); f.flush(); time.sleep(0.02)
    """)
    await jobs.create(JobSpec(name="ticks", command=[sys.executable, path], pause_signal=True))
    run = await jobs.run("ticks")
    await wait_for(lambda: out.exists() and out.stat().st_size > 5, timeout=10)
    await jobs.pause("ticks")
    await asyncio.sleep(1.0)
    held = out.stat().st_size
    await asyncio.sleep(0.5)
    assert out.stat().st_size == held
    await jobs.resume("ticks")
    await wait_for(lambda: out.stat().st_size > held, timeout=10)
    # a stopped process still ends on cancel (SIGCONT before SIGTERM)
    await jobs.pause("ticks")
    await jobs.cancel("ticks")
    assert await finished(jobs, run.id) == "cancelled"


async def test_restart_ends_the_run_and_starts_another(jobs: JobService, tmp_path: Path) -> None:
    path = script(tmp_path, "slow.py", "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    await jobs.create(JobSpec(name="slow", command=[sys.executable, path]))
    first = await jobs.run("slow")
    second = await jobs.restart("slow")
    assert second.id != first.id and second.trigger == "restart"
    assert (await jobs.store.run(first.id)).status == "cancelled"
    await jobs.cancel("slow")
    assert await finished(jobs, second.id) == "cancelled"


async def test_cron_fires_due_ticks_once_and_records_skipped_ones(control_db: ControlDB,
                                                                  tmp_path: Path) -> None:
    now = [1_700_000_000.0]  # 2023-11-14 22:13:20 UTC
    store = JobStore(control_db)
    await store.open()
    started: list[tuple[str, float]] = []
    busy = {"on": False}

    async def start(spec: JobSpec, tick: float) -> None:
        if busy["on"]:
            raise ConflictError("job 'tick' has 1 run(s) going (r1) and max_instances is 1")
        started.append((spec.name, tick))

    await store.create(JobSpec(name="tick", command=["true"], cron="*/5 * * * *"), now[0])
    first = await store.next_fire("tick")
    assert first == 1_700_000_100.0  # 22:15:00
    one = CronScheduler(store, start, clock=lambda: now[0])
    two = CronScheduler(store, start, clock=lambda: now[0])
    assert await one.tick() == [] and started == []
    now[0] = first + 0.5
    fired = await asyncio.gather(one.tick(), two.tick())
    assert sorted(len(f) for f in fired) == [0, 1]  # one scheduler fired the tick
    assert started == [("tick", first)]
    assert await store.next_fire("tick") == first + 300
    busy["on"] = True
    now[0] = first + 300
    assert await one.tick() == ["tick"]
    skipped = await store.list_runs(job="tick", status=["skipped"])
    assert len(skipped) == 1 and "max_instances is 1" in (skipped[0].error or "")
    assert skipped[0].scheduled_for == first + 300


async def test_runs_of_a_killed_server_are_marked_lost(control_db: ControlDB) -> None:
    store = JobStore(control_db)
    await store.open()
    spec = JobSpec(name="orphan", command=["true"])
    await store.create(spec, time.time())
    dead = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await dead.wait()
    run = await store.claim_run(spec, trigger="api", now=time.time())
    await store.beat(run.id, time.time(), pid=dead.pid)  # its process is gone
    assert await store.lose_dead_runs(time.time()) == 1
    record = await store.run(run.id)
    assert record.status == "lost" and "ended without" in (record.error or "")
    # a run whose host stopped beating long ago no longer blocks max_instances
    again = await store.claim_run(spec, trigger="api", now=time.time())
    later = await store.claim_run(spec, trigger="api", now=time.time() + 3600)
    assert (await store.run(again.id)).status == "lost" and later.status == "running"


async def test_a_live_servers_runs_are_no_orphans_to_another_on_the_host(
        jobs: JobService, control_db: ControlDB, tmp_path: Path) -> None:
    """Two servers on one host share the database: the one that opens second leaves the
    runs of the first alone, and so do the job's own child processes."""
    spawn = script(tmp_path, "spawn.py", """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 start_new_session=True)
        print("child", child.pid, flush=True)
        time.sleep(60)
    """)
    await jobs.create(JobSpec(name="spawn", command=[sys.executable, spawn]))
    run = await jobs.run("spawn")
    sink = jobs.sink  # type: ignore[attr-defined]
    said = await wait_for(lambda: [line.message for line in sink.lines
                                   if line.message.startswith("child ")], "the child")
    other = Runner(JobStore(control_db), channel=jobs.channel, runs_dir=tmp_path / "other")
    assert await other.stop_orphans([run.id]) == {}
    assert await jobs.store.lose_dead_runs(time.time(), stop_orphans=other.stop_orphans) == 0
    assert (await jobs.store.run(run.id)).status == "running"
    child = int(said[0].split()[1])
    os.kill(child, 0)  # its own session, the run's environment: still not an orphan
    await jobs.cancel("spawn")
    assert await finished(jobs, run.id) == "cancelled"
    os.kill(child, 9)


async def test_a_run_is_cancelled_alone_here_or_from_another_process(
        jobs: JobService, control_db: ControlDB, tmp_path: Path) -> None:
    path = script(tmp_path, "sleeper.py", """
        import time
        print("up", flush=True)
        time.sleep(60)
    """)
    await jobs.create(JobSpec(name="wide", command=[sys.executable, path], max_instances=3))
    first, second, third = [await jobs.run("wide") for _ in range(3)]
    sink = jobs.sink  # type: ignore[attr-defined]
    await wait_for(lambda: sink.text().count("up") == 3, "three runs up")
    # in this process: at once
    ended = await jobs.cancel_run(first.id, wait=10)
    assert ended.status == "cancelled"
    # from another process on the same database (the CLI beside the server): its runner
    # hears of it at its next poll
    channel = ControlChannel(control_db)
    await channel.open()
    cli = JobService(JobStore(control_db), Runner(JobStore(control_db), channel=channel,
                                                  runs_dir=tmp_path / "cli"))
    asked = await cli.cancel_run(second.id)
    assert asked.status == "running"
    assert await finished(jobs, second.id) == "cancelled"
    assert (await jobs.store.run(third.id)).status == "running"  # the others left alone
    assert await jobs.channel.get("wide") == protocol.RUN
    with pytest.raises(ConflictError, match="cancelled: there is nothing to cancel"):
        await cli.cancel_run(first.id)
    with pytest.raises(NotFoundError):
        await cli.cancel_run("nope")
    assert not await jobs.store.stop_asked(second.id)  # the request ended with its run
    await channel.close()
    await jobs.cancel("wide", wait=10)
    assert await finished(jobs, third.id) == "cancelled"


async def test_a_living_server_sweeps_up_the_runs_of_one_that_died(
        jobs: JobService, control_db: ControlDB, tmp_path: Path) -> None:
    """The sweep ``crawlhub serve`` makes every 30 s: a server on this host killed over
    STALE_AFTER s ago leaves a job process (here paused with SIGSTOP) that is stopped and
    its run lost; a run of another host that stopped beating is lost; runs that beat
    lately, and this server's own, are left alone."""
    store = jobs.store
    path = script(tmp_path, "mine.py", "import time; time.sleep(60)")
    spec = JobSpec(name="left", command=[sys.executable, path], max_instances=5)
    await jobs.create(spec)
    mine = await jobs.run("left")  # this server's own, going on
    now = time.time()
    dead = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await dead.wait()  # the killed server's pid
    lately = await store.claim_run(spec, trigger="api", now=now - 1)
    await store.beat(lately.id, now - 1, pid=dead.pid)  # gone, but beat a second ago
    orphaned = await store.claim_run(spec, trigger="api", now=now - 100)
    env = {**os.environ, protocol.ENV_RUN: orphaned.id,
           protocol.ENV_RUNNER_PID: str(dead.pid)}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env=env, start_new_session=True)
    # stopped only once it runs the new program: a SIGSTOP between fork and exec (a loaded
    # machine) freezes a child whose /proc environ is still this process's, without the run
    await wait_for(lambda: f"{protocol.ENV_RUN}={orphaned.id}".encode()
                   in Path(f"/proc/{orphan.pid}/environ").read_bytes(),
                   "the orphan runs with its run's environment", timeout=30)
    os.kill(orphan.pid, signal.SIGSTOP)
    await store.beat(orphaned.id, now - 100, pid=orphan.pid)
    elsewhere = await store.claim_run(spec, trigger="api", now=now - 100)
    await control_db.execute(f"UPDATE {store.runs} SET host = 'another-host' WHERE id = $1",
                             elsewhere.id)

    assert await jobs.sweep() == 2
    assert orphan.wait(timeout=10) is not None  # stopped, though paused
    runs = {run.id: run for run in await store.list_runs(job="left")}
    assert runs[orphaned.id].status == "lost" and "stopped" in (runs[orphaned.id].error or "")
    assert runs[elsewhere.id].status == "lost" and "stopped reporting" in (
        runs[elsewhere.id].error or "")
    assert runs[lately.id].status == "running" and runs[mine.id].status in LIVE
    assert (await jobs.cancel_run(mine.id, wait=10)).status == "cancelled"


async def test_runs_page_newest_first_by_job_and_status(control_db: ControlDB) -> None:
    store = JobStore(control_db)
    await store.open()
    spec = JobSpec(name="many", command=["true"], max_instances=1000)
    t0 = 1_700_000_000.0
    ids = []
    for i in range(25):
        run = await store.claim_run(spec, trigger="api", now=t0 + i)
        await store.finish(run.id, status="succeeded" if i % 2 else "failed", now=t0 + i + 0.5,
                           exit_code=0 if i % 2 else 1, error=None, counters={"i": i})
        ids.append(run.id)
    page = await store.list_runs(job="many", limit=10)
    assert [r.id for r in page] == ids[::-1][:10]
    nxt = await store.list_runs(job="many", limit=10, before=page[-1].id)
    assert [r.id for r in nxt] == ids[::-1][10:20]
    failed = await store.list_runs(status=["failed"], limit=100)
    assert len(failed) == 13 and all(r.exit_code == 1 for r in failed)


async def test_cancel_lets_a_job_on_the_sdk_end_by_itself(jobs: JobService,
                                                         tmp_path: Path) -> None:
    await jobs.create(counter(tmp_path, 100000))
    run = await jobs.run("count")
    await wait_for(lambda: any(line.task == "count" for line in jobs.sink.lines),  # type: ignore[attr-defined]
                   timeout=10)
    await jobs.cancel("count")
    assert await finished(jobs, run.id) == "cancelled"
    record = await jobs.store.run(run.id)
    assert record.exit_code == 0  # it saw "exit" and stopped cleanly, before any signal
    text = jobs.sink.text()  # type: ignore[attr-defined]
    assert any(line.startswith("exit requested at") for line in text)
    assert record.counters["success"] > 0


def process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` (T: stopped by a signal)."""
    return open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0].decode()


async def test_a_job_that_does_not_acknowledge_a_pause_is_stopped_until_continued(
        jobs: JobService, tmp_path: Path) -> None:
    out = tmp_path / "ticks.txt"
    path = script(tmp_path, "ticks.py", f"""
        import time
        with open({str(out)!r}, "a") as f:
            while True:
                f.write("x"); f.flush(); time.sleep(0.02)
    """)
    # a plain subprocess job: no crawlhub.sdk, no pause_signal
    await jobs.create(JobSpec(name="ticks", command=[sys.executable, path]))
    run = await jobs.run("ticks")
    await wait_for(lambda: out.exists() and out.stat().st_size > 5, timeout=10)
    await jobs.pause("ticks")
    record = await wait_for(lambda: _paused_run(jobs, run.id), "the pause to take effect")
    assert record.paused == "signal"
    pid = record.pid
    assert pid is not None and process_state(pid) == "T"
    held = out.stat().st_size
    assert process_state(pid) == "T" and out.stat().st_size == held  # it writes nothing
    view = await jobs.get("ticks")
    assert view.paused == [run.id]
    await jobs.resume("ticks")
    await wait_for(lambda: out.stat().st_size > held, "the job to go on", timeout=10)

    async def running_again() -> bool:
        return (await jobs.store.run(run.id)).paused is None

    await wait_for(running_again, "the run's row to say it runs again")
    await jobs.cancel("ticks")
    assert await finished(jobs, run.id) == "cancelled"
    assert any("did not acknowledge" in line for line in jobs.sink.text())  # type: ignore[attr-defined]


async def _paused_run(jobs: JobService, run_id: str) -> object:
    record = await jobs.store.run(run_id)
    return record if record.paused else None


async def test_a_job_on_the_sdk_acknowledges_a_pause_and_is_not_stopped(
        jobs: JobService, tmp_path: Path) -> None:
    await jobs.create(counter(tmp_path, 100000))
    run = await jobs.run("count")
    counters = tmp_path / "runs" / run.id / "counters.json"
    await wait_for(lambda: (protocol.read_json(counters) or {}).get("counters"), timeout=10)
    await jobs.pause("count")
    record = await wait_for(lambda: _paused_run(jobs, run.id), "the pause to take effect")
    assert record.paused == "cooperative"  # type: ignore[attr-defined]
    assert process_state(record.pid) != "T"  # type: ignore[attr-defined]
    ack = protocol.read_json(tmp_path / "runs" / run.id / "ack.json")
    assert ack["state"] == protocol.PAUSE
    await jobs.cancel("count")  # a paused job still ends on cancel, by itself
    assert await finished(jobs, run.id) == "cancelled"
    assert (await jobs.store.run(run.id)).exit_code == 0


async def test_a_job_that_opts_out_of_pause_is_refused_and_runs_on(
        jobs: JobService, tmp_path: Path) -> None:
    await jobs.create(JobSpec(name="steady", command=[sys.executable, "-c", "print(1)"],
                              pausable=False))
    with pytest.raises(ConflictError, match="not pausable"):
        await jobs.pause("steady")
    assert await jobs.channel.get("steady") == protocol.RUN
    view = await jobs.get("steady")
    assert view.spec.pausable is False


async def test_cancel_gives_a_scrapy_command_time_to_close_after_one_sigterm(
        jobs: JobService, tmp_path: Path) -> None:
    # A stand-in for `scrapy crawl`: on SIGTERM it closes gracefully, taking longer than
    # the server's grace (1 s here), and a second SIGTERM would make it stop unclean.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scrapy = bin_dir / "scrapy"
    scrapy.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import signal, sys, time
        seen = []
        def term(*_):
            seen.append(1)
            print("Received SIGTERM, shutting down gracefully." if len(seen) == 1
                  else "Received SIGTERM twice, forcing unclean shutdown", flush=True)
        signal.signal(signal.SIGTERM, term)
        print("Spider opened", flush=True)
        while not seen:
            time.sleep(0.02)
        time.sleep(2.5)  # finishing the requests in flight, closing the feed exports
        print("Spider closed (shutdown), SIGTERMs:", len(seen), flush=True)
    """))
    scrapy.chmod(0o755)
    await jobs.create(JobSpec(name="spider", command=[str(scrapy), "crawl", "quotes"]))
    run = await jobs.run("spider")
    await wait_for(lambda: "Spider opened" in jobs.sink.text(), timeout=10)  # type: ignore[attr-defined]
    await jobs.cancel("spider")
    assert await finished(jobs, run.id, timeout=30) == "cancelled"
    record = await jobs.store.run(run.id)
    assert record.exit_code == 0  # it closed by itself, not SIGKILLed
    assert "Spider closed (shutdown), SIGTERMs: 1" in jobs.sink.text()  # type: ignore[attr-defined]


async def test_a_traceback_on_stderr_is_stored_at_error(jobs: JobService,
                                                       tmp_path: Path) -> None:
    path = script(tmp_path, "boom.py", """
        import sys
        print("starting", file=sys.stderr, flush=True)
        def inner():
            raise ValueError("boom")
        try:
            inner()
        except ValueError as exc:
            raise RuntimeError("the job failed") from exc
    """)
    await jobs.create(JobSpec(name="boom", command=[sys.executable, path]))
    run = await jobs.run("boom")
    assert await finished(jobs, run.id) == "failed"
    levels = {line.message: line.level for line in jobs.sink.lines  # type: ignore[attr-defined]
              if line.stream == "stderr"}
    assert levels["starting"] == "info"
    assert levels["Traceback (most recent call last):"] == "error"
    assert levels["ValueError: boom"] == "error"
    assert levels["RuntimeError: the job failed"] == "error"
    assert levels["    raise ValueError(\"boom\")"] == "error"
    assert levels["The above exception was the direct cause of the following exception:"] \
        == "error"


async def test_a_crawl_job_with_a_delay_holds_still_by_itself_on_pause(
        jobs: JobService, tmp_path: Path) -> None:
    from tests.agents.servers import Site

    async with Site(pages=2000) as site:
        await jobs.create(JobSpec(
            name="site", kind="crawl",
            command=[f"{site.url}/page/0", "--follow", "--delay", "0.1", "--quiet",
                     "--data-dir", str(tmp_path / "crawl")],
            env={"PYTHONPATH": os.pathsep.join(sys.path)}))
        run = await jobs.run("site")
        await wait_for(lambda: sum(site.hits.values()) > 5, "pages fetched", timeout=60)
        await jobs.pause("site")
        record = await wait_for(lambda: _paused_run(jobs, run.id), "the pause to take effect")
        # it acknowledged: nothing in flight, its leased tasks waiting - not SIGSTOPped
        assert record.paused == "cooperative"  # type: ignore[attr-defined]
        held = sum(site.hits.values())
        await asyncio.sleep(1.0)  # a window in which a paused crawl must fetch nothing
        assert sum(site.hits.values()) == held
        await jobs.resume("site")
        await wait_for(lambda: sum(site.hits.values()) > held, "the crawl to go on",
                       timeout=30)
        await jobs.cancel("site")
        assert await finished(jobs, run.id, timeout=30) == "cancelled"


async def test_a_runs_table_of_an_older_release_gains_the_new_columns(
        control_db: ControlDB) -> None:
    runs = control_db.table("runs")
    # the runs table as the release before log_dropped / paused made it, with a run
    await control_db.schema([
        f"CREATE TABLE {runs} (id TEXT PRIMARY KEY, job TEXT NOT NULL,"
        " kind TEXT NOT NULL, status TEXT NOT NULL, trigger_ TEXT NOT NULL,"
        " host TEXT NOT NULL, pid BIGINT, scheduled_for DOUBLE PRECISION,"
        " started_at DOUBLE PRECISION NOT NULL, finished_at DOUBLE PRECISION,"
        " heartbeat_at DOUBLE PRECISION, exit_code BIGINT, error TEXT,"
        " counters TEXT NOT NULL, version TEXT)"])
    await control_db.execute(
        f"INSERT INTO {runs} (id, job, kind, status, trigger_, host, started_at, counters)"
        " VALUES ('r-old', 'old', 'subprocess', 'succeeded', 'api', 'h', 1.0, '{}')")
    store = JobStore(control_db)
    await store.open()
    await store.open()  # twice: the columns are there now
    old = await store.run("r-old")
    assert old.log_dropped == 0 and old.paused is None
    await store.set_paused("r-old", "signal")
    assert (await store.run("r-old")).paused == "signal"

"""crawlhub.sdk: the control a job reads (file, callable, none), its counters, its log
lines and task events; and a real counting job process paused, continued and ended
through the control channel and the control file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crawlhub import sdk
from crawlhub.control.channel import ControlChannel, ControlFileWriter
from crawlhub.control.db import ControlDB
from crawlhub.core import jobprotocol as protocol
from crawlhub.core.jobprotocol import LogMessage, TaskEvent, parse_line, write_json_atomic
from tests.helpers import wait_for

JOB = Path(__file__).with_name("counting_job.py")


def set_state(path: Path, state: str) -> None:
    write_json_atomic(path, {"state": state, "changed_at": time.time()})


# -- control ------------------------------------------------------------------------------
def test_without_a_runner_a_job_always_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(protocol.ENV_CONTROL_FILE, raising=False)
    control = sdk.control()
    assert control.state == "run" and control.running
    assert control.wait_while_paused() is True
    assert sdk.job() is None and sdk.run() is None and not sdk.under_runner()


def test_the_process_control_follows_the_runner_file(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "control.json"
    set_state(path, "pause")
    monkeypatch.setenv(protocol.ENV_CONTROL_FILE, str(path))
    monkeypatch.setenv(protocol.ENV_JOB, "nightly")
    monkeypatch.setenv(protocol.ENV_RUN, "r-1")
    control = sdk.control()
    assert control is sdk.control()  # one per process
    assert control.paused and sdk.under_runner()
    assert (sdk.job(), sdk.run()) == ("nightly", "r-1")


def test_a_file_control_sees_each_change_and_keeps_the_last_state_when_the_file_goes(
        tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    control = sdk.Control.from_file(path, check_every=0)
    assert control.state == "run"  # no file yet
    for state in ("pause", "run", "exit", "pause"):
        set_state(path, state)
        assert control.state == state
    path.write_text("{half a fi")  # not what a runner writes; ignored
    assert control.paused
    path.unlink()
    assert control.paused


def test_a_file_control_looks_at_the_file_at_most_every_check_interval(
        tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    set_state(path, "run")
    control = sdk.Control.from_file(path, check_every=3600)
    assert control.running
    set_state(path, "pause")
    assert control.running  # the answer from memory: no stat within the interval
    assert sdk.Control.from_file(path).paused


def test_a_tight_loop_of_checks_stats_the_file_about_once_an_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "control.json"
    set_state(path, "run")
    stats: list[float] = []
    real = os.stat

    def counted(target: Any, *args: Any, **kwargs: Any) -> Any:
        stats.append(time.monotonic())
        return real(target, *args, **kwargs)

    monkeypatch.setattr(sdk.os, "stat", counted)
    control = sdk.Control.from_file(path, check_every=0.05)
    began = time.monotonic()
    checks = 0
    while time.monotonic() - began < 0.5:
        control.paused  # noqa: B018
        checks += 1
    assert checks > 1000
    assert 1 <= len(stats) <= 0.5 / 0.05 + 2, len(stats)


def test_wait_while_paused_blocks_until_continue_and_says_false_on_exit(
        tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    set_state(path, "pause")
    control = sdk.Control.from_file(path, check_every=0)
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(control.wait_while_paused()))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()
    set_state(path, "run")
    waiter.join(5)
    assert answers == [True]
    assert control.wait_while_paused(timeout=0) is True  # running: no wait
    set_state(path, "pause")
    began = time.monotonic()
    assert control.wait_while_paused(timeout=0.2) is True and control.paused
    assert time.monotonic() - began >= 0.2
    set_state(path, "exit")
    assert control.wait_while_paused() is False


async def test_until_running_waits_without_blocking_the_loop() -> None:
    control = sdk.Manual("pause")
    waiting = asyncio.ensure_future(control.until_running())
    await asyncio.sleep(0.2)  # the loop runs meanwhile
    assert not waiting.done()
    control.set("run")
    assert await asyncio.wait_for(waiting, 5) is True
    control.set("exit")
    assert await control.until_running() is False
    with pytest.raises(ValueError, match="run, pause, exit"):
        control.set("halt")


def test_a_callable_control_asks_its_source() -> None:
    box = {"state": "run"}
    control = sdk.Control.from_callable(lambda: box["state"])
    assert control.running
    box["state"] = "pause"
    assert control.paused
    box["state"] = "nonsense"  # not a state: the last one stands
    assert control.paused


# -- counters -----------------------------------------------------------------------------
def read_counters(path: Path) -> dict[str, Any]:
    data = protocol.read_json(path)
    return data["counters"] if isinstance(data, dict) else {}


def test_counters_reach_the_file_after_a_quiet_spell_and_on_flush(tmp_path: Path) -> None:
    path = tmp_path / "counters.json"
    counters = sdk.Counters(path, flush_every=0.2)
    for _ in range(1000):
        counters.count("items")
    counters.count("bytes", 2.5)
    counters.set("queued", 7)
    assert counters.snapshot() == {"items": 1000, "bytes": 2.5, "queued": 7}
    deadline = time.monotonic() + 10
    while read_counters(path) != {"items": 1000, "bytes": 2.5, "queued": 7}:
        assert time.monotonic() < deadline, "the timer never wrote the counters"
        time.sleep(0.05)
    counters.update({"items": 5, "errors": 1})
    counters.flush()
    data = json.loads(path.read_text())
    assert data["counters"] == {"items": 5, "bytes": 2.5, "queued": 7, "errors": 1}
    assert abs(data["updated_at"] - time.time()) < 60


def test_counting_writes_the_file_at_most_every_flush_interval(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    path = tmp_path / "counters.json"
    writes: list[float] = []
    real = sdk.write_json_atomic

    def counted(target: Any, value: Any) -> None:
        writes.append(time.monotonic())
        real(target, value)

    monkeypatch.setattr(sdk, "write_json_atomic", counted)
    counters = sdk.Counters(path, flush_every=0.2)
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < 1.0:
        counters.count("items")
        n += 1
    counters.flush()
    assert read_counters(path) == {"items": n}
    assert n > 10_000
    assert 1 <= len(writes) <= 1.0 / 0.2 + 3, writes  # ~5 in a second, not one per count


def test_process_counters_go_to_the_runner_file(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "counters.json"
    monkeypatch.setenv(protocol.ENV_COUNTERS_FILE, str(path))
    sdk.count("pages")
    sdk.count("pages", 2)
    sdk.set_counter("queued", 4)
    sdk.set_counters({"errors": 1})
    assert sdk.counters() == {"pages": 3, "queued": 4, "errors": 1}
    sdk.flush()
    assert read_counters(path) == {"pages": 3, "queued": 4, "errors": 1}
    assert sdk.process_counters().path == path


# -- log lines and tasks ------------------------------------------------------------------
def test_log_and_task_print_the_runner_messages(capsys: pytest.CaptureFixture[str]) -> None:
    sdk.log("hello ✓")
    with sdk.task("t-1"):
        sdk.log("inside", level="WARNING")
    with pytest.raises(KeyError), sdk.task("t-2"):
        raise KeyError("missing")
    lines = capsys.readouterr().out.splitlines()
    parsed = [parse_line(line) for line in lines]
    assert parsed[0] == LogMessage("hello ✓", "info", None)
    assert isinstance(parsed[1], TaskEvent) and (parsed[1].task, parsed[1].status) == (
        "t-1", "running")
    assert parsed[2] == LogMessage("inside", "warning", "t-1")  # the enclosing task
    assert isinstance(parsed[3], TaskEvent) and parsed[3].status == "succeeded"
    assert isinstance(parsed[5], TaskEvent) and parsed[5].status == "failed"
    assert parsed[5].task == "t-2" and parsed[5].detail == "KeyError: 'missing'"
    with pytest.raises(ValueError, match="log level"):
        sdk.log("x", level="loud")


def test_the_sdk_imports_nothing_heavy() -> None:
    code = ("import sys, crawlhub.sdk; heavy = {'aiohttp', 'fastapi', 'redis', 'asyncpg',"
            " 'pydantic', 'httpx'} & set(sys.modules); print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# -- a real job process -------------------------------------------------------------------
@pytest.fixture
async def channel(tmp_path: Path) -> AsyncIterator[ControlChannel]:
    db = await ControlDB.open(f"sqlite:///{tmp_path}/control.db")
    chan = ControlChannel(db)
    await chan.open()
    yield chan
    await chan.close()
    await db.close()


class CountingJob:
    """The counting job as a process, with the files a runner gives it."""

    def __init__(self, tmp_path: Path) -> None:
        self.control_file = tmp_path / "control.json"
        self.counters_file = tmp_path / "counters.json"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {**os.environ, protocol.ENV_JOB: "counter", protocol.ENV_RUN: "r-1",
               protocol.ENV_CONTROL_FILE: str(self.control_file),
               protocol.ENV_COUNTERS_FILE: str(self.counters_file)}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(JOB), env=env, stdout=asyncio.subprocess.PIPE)

    def ticks(self) -> int:
        return int(read_counters(self.counters_file).get("ticks", 0))

    async def end(self) -> tuple[int, list[Any]]:
        assert self.proc is not None
        out, _ = await asyncio.wait_for(self.proc.communicate(), 20)
        return self.proc.returncode or 0, [parse_line(line) for line in out.decode().splitlines()]

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()


async def test_a_counting_job_pauses_continues_and_exits_with_its_counters_flushed(
        channel: ControlChannel, tmp_path: Path) -> None:
    job = CountingJob(tmp_path)
    async with ControlFileWriter(channel, "counter", job.control_file):
        try:
            await job.start()
            await wait_for(lambda: job.ticks() >= 5, "the job to count")
            await channel.set("counter", "pause")
            await asyncio.sleep(1.5)  # the pause lands, the last counts are flushed
            held = job.ticks()
            await asyncio.sleep(1.0)
            assert job.ticks() == held, "the counter moved while the job was paused"
            await channel.set("counter", "run")
            await wait_for(lambda: job.ticks() > held, "the counter to move again")
            await channel.set("counter", "exit")
            code, lines = await job.end()
        finally:
            job.kill()
    assert code == 0
    messages = [m.message for m in lines if isinstance(m, LogMessage)]
    assert any(m.startswith("paused at ") for m in messages)
    final = next(m for m in messages if m.startswith("exit after "))
    assert final == f"exit after {job.ticks()} ticks"  # the last count reached the file
    events = [(e.task, e.status) for e in lines if isinstance(e, TaskEvent)]
    assert events == [("count", "running"), ("count", "succeeded")]


async def test_a_job_paused_before_its_run_starts_paused(channel: ControlChannel,
                                                       tmp_path: Path) -> None:
    job = CountingJob(tmp_path)
    await channel.set("counter", "pause")
    async with ControlFileWriter(channel, "counter", job.control_file):
        try:
            await job.start()
            await asyncio.sleep(1.5)
            assert job.ticks() == 0
            await channel.set("counter", "run")
            await wait_for(lambda: job.ticks() > 0, "the job to count after continue")
            await channel.set("counter", "exit")
            code, lines = await job.end()
        finally:
            job.kill()
    assert code == 0
    paused = [m.message for m in lines
              if isinstance(m, LogMessage) and m.message.startswith("paused at ")]
    assert len(paused) == 1 and paused[0].endswith(" after 0 ticks")

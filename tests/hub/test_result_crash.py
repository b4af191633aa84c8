"""No result is lost or counted twice when the hub process handling it is killed: a hub
child process SIGKILLs itself at a named point of the result path (after a settle, after
a follow-up push, after a failure line, after a sweep's claim); a restarted one sweeps,
the results are delivered again, and every task is resolved once or queued again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.hub.failures import FailureLog
from crawlhub.services import Services
from tests.hub.conftest import delete_prefix

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: The result each kind of task gets: terminal, retry on "o", direct failback to "b",
#: and failed on "c" (no retries there).
CODES = {"ok": 1000, "retry": 500, "fallback": 503, "fail": 500}
ORDER = ["ok", "retry", "fallback", "fail"] * 2
OUTBOUNDS = [
    {"name": "c", "selector": ["kind == 'fail'"], "retry_limits": 0},
    {"name": "o", "selector": ["kind != 'fail'"], "retry_limits": 1,
     "direct_failback_status": [503], "failback": "b"},
    {"name": "b", "selector": ["False"], "retry_limits": 0},
]


@dataclass
class Setup:
    tmp: Path
    config: dict[str, Any]

    def services(self) -> Any:
        return Services.open(CrawlhubConfig.model_validate(self.config))

    def child(self, mode: str, clock: float, results: Path | None = None,
              kill_at: str = "") -> subprocess.CompletedProcess[str]:
        path = self.tmp / "config.json"
        path.write_text(json.dumps(self.config))
        args = [sys.executable, "-m", "tests.hub.result_child", str(path), repr(clock), mode]
        if results is not None:
            args.append(str(results))
        env = {**os.environ, "CRAWLHUB_TEST_KILL_AT": kill_at or "none:0"}
        return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)


@pytest.fixture(params=["sqlite", "redis"])
async def setup(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
                ) -> AsyncIterator[Setup]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        storage = {"queues": url, "state": url, "redis_prefix": f"{unique_name}:"}
    else:
        storage = {"queues": f"sqlite:///{tmp_path}/queues.db",
                   "state": f"sqlite:///{tmp_path}/hub.db"}
    yield Setup(tmp_path, {
        "data_dir": str(tmp_path), "storage": storage,
        "failure": {"path": str(tmp_path / "failures.jsonl")},
        "inbound": [{"name": "http", "class": "http"}],
        "routing": {"terminal_codes": [1000]},
        "outbound": OUTBOUNDS})
    if request.param == "redis":
        await delete_prefix(request.getfixturevalue("redis_url"), f"{unique_name}:")


async def drain(svc: Services, names: list[str]) -> list[dict[str, Any]]:
    """Take every message off the queues, as workers would."""
    out = []
    for name in names:
        queue = svc.queues.queue(name)
        messages = await queue.lease(1000, 600)
        await queue.ack([m.id for m in messages])
        out += [m.payload for m in messages]
    return out


def result(task: dict[str, Any], code: int) -> dict[str, Any]:
    """What a worker posts back: the task's identity and dispatch, and its status."""
    return {"task_uuid": task["task_uuid"], "routed_count": task["routed_count"],
            "outbound": task["outbound"], "task_result": code}


def without_orphans(counters: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out = {name: {k: v for k, v in c.items() if k != "orphan" and v}
           for name, c in counters.items()}
    return {name: c for name, c in out.items() if c}


# Settles in the order the child makes them: ok (1), retry (2 settle, 3 release),
# fallback (4, 5), fail (6 settle, 7 release after the failure line).
RESULT_KILLS = ["settle:1", "settle:2", "push:1", "settle:3", "settle:4", "settle:5",
                "settle:6", "failure:1", "settle:7"]


@pytest.mark.parametrize("kill_at", RESULT_KILLS)
async def test_a_hub_killed_while_handling_results_loses_and_doubles_nothing(
        setup: Setup, kill_at: str) -> None:
    svc = await setup.services()
    try:
        answers = await svc.hub.submit([{"kind": k, "n": i} for i, k in enumerate(ORDER)])
        by_uuid = {t["task_uuid"]: t for t in await drain(svc, ["o", "c"])}
    finally:
        await svc.close()
    tasks = [by_uuid[a.task_uuid] for a in answers if a.task_uuid]
    results = setup.tmp / "results.json"
    results.write_text(json.dumps([result(t, CODES[t["kind"]]) for t in tasks]))

    now = time.time()
    killed = setup.child("results", now, results, kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    recovery = setup.child("sweep", now + 3600)  # after every lease of the killed one
    assert recovery.returncode == 0, recovery.stderr
    again = setup.child("results", now + 3600, results)  # every result delivered again
    assert again.returncode == 0, again.stderr
    assert len(again.stdout.splitlines()) == len(tasks)

    svc = await setup.services()
    try:
        assert without_orphans(await svc.state.counters()) == {
            "o": {"total": 8, "success": 2, "retried": 2, "failback": 2},
            "b": {"total": 2}, "c": {"total": 2, "failed": 2}}
        assert await svc.state.claim_expired(now + 7200) == []  # nothing left leased
        queued = await drain(svc, ["o", "b", "c"])
        copies = Counter(t["task_uuid"] for t in queued)
        failed = Counter(r["task"]["task_uuid"]
                         for r in FailureLog(setup.tmp / "failures.jsonl").read())
        first_retry, first_fail = tasks[1]["task_uuid"], tasks[3]["task_uuid"]
        for task in tasks:
            uuid, kind = task["task_uuid"], task["kind"]
            entry = await svc.state.get(uuid)
            if kind in ("ok", "fail"):
                assert entry is None and copies[uuid] == 0
            else:
                assert entry is not None and entry.task["routed_count"] == 2
                assert entry.outbound == ("o" if kind == "retry" else "b")
                # A kill after the push and before its release pushes it again on
                # recovery: the one window where a dispatch is queued twice.
                assert copies[uuid] == (2 if (kill_at, uuid) == ("push:1", first_retry)
                                        else 1)
            if kind == "fail":
                # Likewise a kill after the failure line and before its release.
                assert failed[uuid] == (2 if (kill_at, uuid) == ("failure:1", first_fail)
                                        else 1)
        # Whatever is queued is one dispatch per task: the first result settles it.
        outcomes = await svc.hub.receive("http", [result(t, 1000) for t in queued])
        statuses = Counter(o["status"] for o in outcomes)
        assert statuses["success"] == 4 and statuses["success"] + statuses["orphan"] == len(
            queued)
        assert await svc.state.pending() == 0
    finally:
        await svc.close()


SWEEP_KILLS = ["claim:1", "settle:1", "push:1", "settle:2", "settle:3"]


@pytest.mark.parametrize("kill_at", SWEEP_KILLS)
async def test_a_hub_killed_while_sweeping_lost_tasks_loses_and_doubles_nothing(
        setup: Setup, kill_at: str) -> None:
    setup.config["outbound"] = [{"name": "o", "result_timeout": "1h", "retry_limits": 1}]
    svc = await setup.services()
    try:
        answers = await svc.hub.submit([{"n": i} for i in range(3)])
        await drain(svc, ["o"])
    finally:
        await svc.close()
    uuids = [a.task_uuid for a in answers]

    lost_at = time.time() + 3601  # every deadline has passed
    killed = setup.child("sweep", lost_at, kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    recovery = setup.child("sweep", lost_at + 31)  # the killed one's leases have ended
    assert recovery.returncode == 0, recovery.stderr

    svc = await setup.services()
    try:
        assert without_orphans(await svc.state.counters()) == {
            "o": {"total": 6, "timeout": 3, "retried": 3}}
        assert await svc.state.claim_expired(lost_at + 32) == []
        copies = Counter(t["task_uuid"] for t in await drain(svc, ["o"]))
        for uuid in uuids:
            entry = await svc.state.get(uuid)
            assert entry is not None and entry.task["routed_count"] == 2
        # The task whose push the kill followed is queued twice (pushed again on recovery).
        assert sorted(copies[u] for u in uuids) == ([1, 1, 2] if kill_at == "push:1"
                                                    else [1, 1, 1])
    finally:
        await svc.close()

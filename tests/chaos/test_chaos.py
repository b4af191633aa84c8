"""Chaos: ``crawlhub serve`` SIGKILLed at random moments while four clients submit and
retry, on SQLite and on Redis (whose server is also restarted mid-run), with and without
a frontier in front of the outbound. Nothing answered 200 is lost, nothing is doubled."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import ChaosSpec, run_chaos

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("frontier", [False, True], ids=["plain", "frontier"])
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_sigkills_and_a_redis_restart_lose_and_double_nothing(
        backend: str, frontier: bool, tmp_path: Path) -> None:
    spec = ChaosSpec(backend=backend, frontier=frontier, tasks=6_000, batch=50, kills=3,
                     redis_restarts=1, seed=len(backend) * 10 + frontier)
    report = await run_chaos(spec, log_dir=tmp_path)
    summary = (f"{spec.label}: answered {report.answered}, found {report.found},"
               f" lost {report.lost} {report.lost_sample}, doubled {report.doubled},"
               f" failures {report.failures_text()}, statuses {dict(report.statuses)}")
    assert report.kills == spec.kills, summary
    assert report.answered == spec.tasks, summary
    assert report.lost == 0, summary
    assert report.doubled == 0, summary
    assert report.found == spec.tasks, summary
    # Outages are answered 503 (207 when part of a list was taken) or cut connections,
    # never a 5xx of another kind.
    assert set(report.failures) <= {"503", "207", "connection"}, summary


async def test_tasks_without_a_uuid_answered_200_survive_sigkills_and_a_redis_restart(
        tmp_path: Path) -> None:
    """Tasks that carry no task_uuid go into Redis by MULTI (hub/state/intake/ids.py):
    every one answered routed is in the queue. Nothing tells the hub a resent one was
    sent before, so only those can be there twice."""
    spec = ChaosSpec(backend="redis", tasks=6_000, batch=50, kills=3, redis_restarts=1,
                     seed=7, uuids=False)
    report = await run_chaos(spec, log_dir=tmp_path)
    summary = (f"{spec.label}: answered {report.answered}, found {report.found},"
               f" lost {report.lost} {report.lost_sample}, doubled {report.doubled},"
               f" resent {report.resent}, failures {report.failures_text()}")
    assert report.kills == spec.kills and report.redis_restarts == 1, summary
    assert report.answered == report.found == spec.tasks, summary
    assert report.lost == 0, summary
    assert report.doubled <= report.resent, summary

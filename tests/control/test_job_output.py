"""A job's output in the log store, counted in what the user finds there: every line of a
job printing as fast as it can is stored (the job is slowed, not cut); lines a bound must
drop while the store is away are counted on the run; a traceback is stored at error.
Real subprocesses, a real SQLite log store."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.control.channel import ControlChannel
from crawlhub.control.db import ControlDB
from crawlhub.control.jobs import JobService, JobSpec, JobStore, Runner
from crawlhub.control.logs import LogQuery, LogService, LogStore
from crawlhub.control.logs.transport import DirectTransport
from tests.control.logs.test_transport import Gate

#: Prints ``n`` numbered lines as fast as it can (one write call per 1,000 lines).
SPEW = ("import sys\nn = int(sys.argv[1])\nw = sys.stdout.write\n"
        "for i in range(0, n, 1000):\n"
        "    w(''.join(f'line {j}\\n' for j in range(i, min(n, i + 1000))))\n")


async def run_lines(store: LogStore, run_id: str) -> list[str]:
    """Every message of ``run_id`` in the store, oldest first (paged as a user would)."""
    out: list[str] = []
    after = 0
    while True:
        page = await store.search(LogQuery(run=run_id, after=after, limit=1000))
        out += [line.message for line in page.lines]
        if page.next is None:
            return out
        after = page.next


@pytest.fixture
async def plane(control_db: ControlDB, tmp_path: Path) -> AsyncIterator[tuple[JobService, LogService, Gate]]:
    """Jobs whose output goes to a real log store through a small buffer (2,000 lines:
    the same bound as the default 100,000, hit sooner), as ``crawlhub serve`` wires it;
    the store behind a gate that can make it unreachable."""
    logs_db = await ControlDB.open(f"sqlite:///{tmp_path}/logs.db")
    from crawlhub.control.logs import open_log_store

    store = open_log_store(logs_db)
    await store.open()
    gate = Gate(store)
    logs = LogService(store, DirectTransport(gate, capacity=2000,  # type: ignore[arg-type]
                                             patience=0.2))
    await logs.start(prune=False, ship=False)
    channel = ControlChannel(control_db)
    await channel.open()
    runner = Runner(JobStore(control_db), channel=channel, runs_dir=tmp_path / "runs",
                    grace=1.0, beat=0.2, log_sink=logs.write, log_dropped=logs.dropped_of,
                    log_flush=logs.flush)
    jobs = JobService(runner.store, runner)
    await jobs.open()
    yield jobs, logs, gate
    await jobs.close()
    await channel.close()
    gate.down = False
    await logs.close()


async def test_every_line_of_a_job_printing_as_fast_as_it_can_is_stored(
        plane: tuple[JobService, LogService, Gate]) -> None:
    jobs, logs, _ = plane
    n = 30_000
    await jobs.create(JobSpec(name="spew", command=[sys.executable, "-c", SPEW, str(n)]))
    run = await jobs.run("spew")
    record = await jobs.runner.wait(run.id)
    assert record.status == "succeeded"
    stored = await run_lines(logs.store, run.id)
    assert len(stored) == n, f"{n - len(stored)} of {n} lines missing"
    assert stored == [f"line {i}" for i in range(n)]
    assert record.log_dropped == 0
    assert logs.stats()["dropped"] == 0 and logs.stats()["waits"] > 0  # slowed, not cut


async def test_lines_a_bound_drops_while_the_store_is_away_are_counted_on_the_run(
        plane: tuple[JobService, LogService, Gate]) -> None:
    jobs, logs, gate = plane
    n = 6_000
    await jobs.create(JobSpec(name="spew", command=[sys.executable, "-c", SPEW, str(n)]))
    gate.down = True  # the job is slowed, then (its patience out) lines are dropped
    run = await jobs.run("spew")
    record = await jobs.runner.wait(run.id)
    assert record.status == "succeeded"  # the store away never stops the job for good
    assert record.log_dropped > 0
    assert (await jobs.store.run(run.id)).log_dropped == record.log_dropped
    gate.down = False
    await logs.flush()
    stored = await run_lines(logs.store, run.id)
    job_lines = [m for m in stored if m.startswith("line ")]
    # nothing vanishes unsaid: each line is stored or counted as dropped
    assert len(job_lines) + record.log_dropped == n
    assert f"line {n - 1}" in job_lines  # the newest are kept, the oldest dropped
    assert "crawlhub_log_lines_dropped_total" in logs.metrics_text()

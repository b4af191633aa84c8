"""Resume after kill -9: a worker process admitting, leasing and finishing seeds is
killed with SIGKILL at random points, several rounds; afterwards every admitted seed is
done or dispatched again, none is lost and none was admitted twice in its segment."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crawlhub.frontier import Seed
from tests.helpers import wait_for

from .resume_worker import VISIBILITY, frontier

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 5


def run_and_kill(url: str, prefix: str, journal: Path, seed: int, rng: random.Random) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.frontier.resume_worker", url, prefix, str(journal),
         str(seed)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        time.sleep(rng.uniform(0.02, 0.6))
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "worker died"
    finally:
        proc.kill()  # SIGKILL: no close(), no final snapshot, leases left hanging
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()


@pytest.mark.slow
async def test_kill_9_at_random_points_loses_and_duplicates_nothing(
    storage_url: str, unique_name: str, tmp_path: Path
) -> None:
    prefix = f"{unique_name}:"
    journal = tmp_path / "journal.txt"
    rng = random.Random(unique_name)
    for _ in range(ROUNDS):
        run_and_kill(storage_url, prefix, journal, rng.randrange(1 << 30), rng)

    records = [line.split(" ", 1) for line in journal.read_text().splitlines() if line]
    admitted = [key for op, key in records if op == "A"]
    seen = {key for _, key in records}
    assert admitted, "the workers admitted nothing before being killed"
    assert len(admitted) == len(set(admitted)), "a key was admitted twice in its segment"

    f = frontier(storage_url, prefix)
    f.config.exact = True  # confirm against the stored seeds, not just the filter
    f.config.snapshot_interval = 0
    try:
        # Drain: everything still owed (pending, retried, abandoned or cached by a
        # killed worker) comes back once its lease expires.
        async def drained() -> bool:
            leased = await f.lease(100, 30)
            for s in leased:
                seen.add(s.key)  # type: ignore[arg-type]
                assert await f.finish(s, "ok")
            (row,) = await f.stats()
            if row["pending"] == 0 and row["leased"] == 0:
                return True
            if not leased:
                await f.wait_ready(3 * VISIBILITY)
            return False

        await wait_for(drained, "every seed owed to come back and be finished", every=0)
        (row,) = await f.stats()
        assert (row["pending"], row["leased"]) == (0, 0), row
        assert row["done"] == row["admitted"], row
        # Every seed stored was seen by someone, each exactly once in the counters...
        assert row["admitted"] == len(seen)
        # ...and every admission a worker was told about is still there.
        readmit = await f.admit([Seed(key) for key in sorted(set(admitted))])
        assert not any(readmit), "an admitted seed was lost"
    finally:
        await f.store.purge() if storage_url.startswith("redis") else None
        await f.close()

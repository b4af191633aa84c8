"""The crawl chaos harness: ``crawlhub crawl`` SIGKILLed at random points, then resumed.

Each trial crawls the bench site (``bench/crawl_site.py``, N pages, served by its own
process) into a fresh ``--out`` file and data dir, SIGKILLs the crawl once the output
holds a random number of pages (plus a random moment more), then runs the same command
again, which must finish by itself. The pages are counted in the user's output file, not
in crawlhub's tables: every page once (lost 0, doubled 0).

Used by ``tests/chaos/test_crawl_chaos.py`` (a few hundred pages, asserted) and
``bench/chaos.py --only crawl`` (5,000 pages, 20 kills, a table).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cli.serving import crawlhub_command

SITE = Path(__file__).resolve().parent.parent.parent / "bench" / "crawl_site.py"


@dataclass
class CrawlChaosSpec:
    pages: int = 5_000
    #: trials: each SIGKILLs one crawl at a random point, then resumes it
    kills: int = 20
    concurrency: int = 64
    seed: int = 0
    #: seconds a resumed crawl gets to finish by itself before it counts as hung
    timeout: float = 300.0
    #: every other kill waits (after its random moment) until the crawl holds links
    #: recorded and not pushed yet, the window a resumed run must recover
    aim: bool = False


@dataclass
class CrawlChaosReport:
    spec: CrawlChaosSpec
    kills: int = 0
    #: resumed runs that exited 0 by themselves
    finished: int = 0
    expected: int = 0  # pages over all trials
    found: int = 0  # distinct pages in the output files
    lost: int = 0
    doubled: int = 0  # lines beyond one per page
    #: kills that left links recorded and not pushed (the resumed run must push them)
    mid_intake: int = 0
    #: pages in the output at each kill
    kill_points: list[int] = field(default_factory=list)
    #: what went wrong, one line per bad trial (hung, exit status, lost, doubled)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: seconds of the undisturbed crawl the trials' kill points fall in
    clean_seconds: float = 0.0


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _unpushed_rows(data_dir: Path) -> int:
    """Links (and start URLs) a killed crawl recorded and did not push."""
    with contextlib.suppress(sqlite3.Error):
        db = sqlite3.connect(f"file:{data_dir / 'hub.db'}?mode=ro", uri=True, timeout=5)
        try:
            return int(db.execute("SELECT count(*) FROM unpushed").fetchone()[0])
        finally:
            db.close()
    return 0


async def _until_mid_intake(proc: asyncio.subprocess.Process, data_dir: Path) -> None:
    """Wait until the crawl holds links recorded and not pushed (or has ended)."""
    path = data_dir / "hub.db"
    while proc.returncode is None:
        if path.exists():
            with contextlib.suppress(sqlite3.Error):
                db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.05)
                try:
                    while proc.returncode is None:
                        if db.execute("SELECT 1 FROM unpushed LIMIT 1").fetchone():
                            return
                        await asyncio.sleep(0.002)
                finally:
                    db.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.01)


def _unpushed(data_dir: Path) -> str:
    """What the hub ledger of a hung crawl holds (for the report)."""
    with contextlib.suppress(sqlite3.Error):
        db = sqlite3.connect(f"file:{data_dir / 'hub.db'}?mode=ro", uri=True, timeout=1)
        try:
            ledger = db.execute("SELECT count(*) FROM ledger").fetchone()[0]
            unpushed = db.execute("SELECT count(*) FROM unpushed").fetchone()[0]
            leases = db.execute("SELECT count(*) FROM leases").fetchone()[0]
            return f"ledger {ledger}, unpushed {unpushed}, leases {leases}"
        finally:
            db.close()
    return "hub.db unreadable"


async def _site(pages: int) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SITE), "--pages", str(pages), stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if not line.startswith(b"ready "):
        proc.kill()
        raise RuntimeError(f"the bench site did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def _argv(spec: CrawlChaosSpec, url: str, out: Path, data: Path) -> list[str]:
    return [*crawlhub_command(), "crawl", f"{url}/p/0", "--follow", "--concurrency",
            str(spec.concurrency), "--out", str(out), "--data-dir", str(data), "--quiet"]


async def _trial(spec: CrawlChaosSpec, url: str, workdir: Path, rng: random.Random,
                 report: CrawlChaosReport, n: int, span: float) -> None:
    out, data = workdir / f"items-{n}.jsonl", workdir / f"data-{n}"
    argv = _argv(spec, url, out, data)
    log = (workdir / f"crawl-{n}.log").open("ab")
    try:
        moment = rng.random() * span
        for _ in range(5):  # a run that ended before its moment: again, from scratch
            first = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
            # a random moment of the run (the output grows in batches: a time, not a count)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(first.wait(), moment)
            if spec.aim and n % 2:
                await _until_mid_intake(first, data)
            if first.returncode is None:
                first.send_signal(signal.SIGKILL)
                await first.wait()
                report.kills += 1
                report.kill_points.append(_lines(out))
                report.mid_intake += _unpushed_rows(data) > 0
                break
            moment /= 2
            shutil.rmtree(data, ignore_errors=True)
            for path in (out, out.with_name(out.name + ".index.sqlite")):
                path.unlink(missing_ok=True)
        second = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
        try:
            await asyncio.wait_for(second.wait(), spec.timeout)
        except TimeoutError:
            report.problems.append(f"trial {n}: the resumed crawl hung ({_lines(out)} pages"
                                   f" written; {_unpushed(data)}); killed")
            second.send_signal(signal.SIGKILL)
            await second.wait()
        else:
            if second.returncode == 0:
                report.finished += 1
            else:
                report.problems.append(f"trial {n}: the resumed crawl exited"
                                       f" {second.returncode}")
    finally:
        log.close()
    urls = [json.loads(line)["url"] for line in out.read_text().splitlines() if line.strip()] \
        if out.exists() else []
    pages = {f"{url}/p/{i}" for i in range(spec.pages)}
    distinct = set(urls) & pages
    report.expected += spec.pages
    report.found += len(distinct)
    lost, doubled = spec.pages - len(distinct), len(urls) - len(set(urls))
    report.lost += lost
    report.doubled += doubled
    if lost or doubled:
        report.problems.append(f"trial {n}: lost {lost}, doubled {doubled}")


async def run_crawl_chaos(spec: CrawlChaosSpec, *, workdir: Path | None = None
                          ) -> CrawlChaosReport:
    """``spec.kills`` trials (see the module docstring) against one bench site."""
    rng = random.Random(spec.seed)
    report = CrawlChaosReport(spec)
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="crawlhub-crawl-chaos-")) if workdir is None \
        else workdir
    site, url = await _site(spec.pages)
    start = time.perf_counter()
    try:
        # an undisturbed crawl first: its length is the span the kill points fall in
        clean = await asyncio.create_subprocess_exec(
            *_argv(spec, url, root / "clean.jsonl", root / "clean"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(clean.communicate(), spec.timeout)
        if clean.returncode != 0:
            raise RuntimeError(f"an undisturbed crawl failed: {err.decode()[-2000:]}")
        report.clean_seconds = time.perf_counter() - start
        for n in range(spec.kills):
            await _trial(spec, url, root, rng, report, n, report.clean_seconds)
    finally:
        report.seconds = time.perf_counter() - start
        site.send_signal(signal.SIGKILL)
        await site.wait()
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return report


if __name__ == "__main__":  # a quick look: python -m tests.chaos.crawl PAGES KILLS
    _spec = CrawlChaosSpec(pages=int(sys.argv[1]), kills=int(sys.argv[2]),
                           timeout=float(os.environ.get("TIMEOUT", "60")))
    _report = asyncio.run(run_crawl_chaos(_spec))
    print(_report)

"""Chaos: ``crawlhub crawl`` SIGKILLed at random points of a crawl, then the same command
again: every resumed run finishes by itself, and the output file holds every page once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.crawl import CrawlChaosSpec, run_crawl_chaos

pytestmark = pytest.mark.slow


async def test_crawls_sigkilled_at_random_points_resume_and_write_every_page_once(
        tmp_path: Path) -> None:
    spec = CrawlChaosSpec(pages=300, kills=6, seed=18, timeout=120, aim=True)
    report = await run_crawl_chaos(spec, workdir=tmp_path)
    summary = (f"kills {report.kills} (at pages {report.kill_points}, {report.mid_intake}"
               f" mid-intake), finished {report.finished}/{spec.kills}, found"
               f" {report.found}/{report.expected}, lost {report.lost}, doubled"
               f" {report.doubled}; {report.problems}")
    assert report.kills == spec.kills, summary
    assert report.finished == spec.kills, summary
    assert report.lost == 0 and report.doubled == 0, summary
    assert report.found == report.expected == spec.pages * spec.kills, summary

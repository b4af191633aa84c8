"""``crawlhub collect NAME`` end to end: a run killed with SIGKILL resumes from its saved
offset, misses nothing and doubles nothing; a normal run prints its RunResult."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crawlhub.cli import app
from crawlhub.collect.build import new_run
from crawlhub.collect.service import metadata_url_for
from crawlhub.collect.store import open_metadata_store
from crawlhub.config.loader import load_config
from crawlhub.pipeline.result import Status
from tests.collect.conftest import LazyItems, list_offsets, write_news_config
from tests.httpapi import ApiServer, Fault


def write_config(tmp_path: Path, url: str) -> Path:
    return write_news_config(tmp_path, url)


def jsonl_ids(path: Path) -> list[int]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


@pytest.mark.slow
async def test_a_run_killed_with_sigkill_resumes_from_its_saved_offset(tmp_path: Path) -> None:
    items = LazyItems(2000)
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        cfg_path = write_config(tmp_path, api.url)
        api.inject(Fault.slow(120), when=lambda r: r.query.get("offset") == "1200")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from crawlhub.cli import main; main()",
            "collect", "news", "-c", str(cfg_path), "--no-progress",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            await api.wait_for_requests(9, timeout=60)  # total + 1900..1300 + 1200 (hangs)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        assert jsonl_ids(tmp_path / "news.jsonl") != []
        api.clear_faults()
        api.log.clear()
        items.total = 2150  # new items arrived while it was down

        cfg = load_config(cfg_path)
        store = await open_metadata_store(metadata_url_for(cfg))
        try:
            crashed = await store.load_progress("news")
            assert crashed is not None and crashed.run_id and crashed.saved_offset == 1200
            result = await new_run(cfg.jobs[0], store=store, config=cfg).run()
            runs = await store.runs("news")
        finally:
            await store.close()
        offsets = list_offsets(api)
    assert result.status is Status.SUCCEEDED
    assert offsets[:3] == [(0, 1), (2050, 100), (1950, 100)]
    assert offsets[3:] == [(o, 100) for o in range(1200, -1, -100)]
    ids = jsonl_ids(tmp_path / "news.jsonl")
    assert sorted(set(ids)) == list(range(2150))  # nothing in range missed
    assert len(ids) == len(set(ids))  # boundary duplicates absorbed by the sink's keys
    assert [r.status for r in runs] == ["SUCCEEDED", "CRASHED"]


def test_cli_collect_runs_a_job_and_prints_the_run_result(tmp_path: Path) -> None:
    with ApiServer(items=LazyItems(250)).in_thread() as api:  # type: ignore[arg-type]
        cfg_path = write_config(tmp_path, api.url)
        result = CliRunner().invoke(app, ["collect", "news", "-c", str(cfg_path), "--json",
                                          "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "SUCCEEDED"
    assert data["records"]["written"] == 250
    assert data["requests"]["ok"] == 4


def test_cli_collect_names_the_known_jobs_for_an_unknown_one(tmp_path: Path) -> None:
    cfg_path = write_config(tmp_path, "http://127.0.0.1:9")
    result = CliRunner().invoke(app, ["collect", "nope", "-c", str(cfg_path)])
    assert result.exit_code == 2
    assert "known jobs: news" in result.output


def test_cli_collect_with_a_progress_bar_prints_the_summary_table(tmp_path: Path) -> None:
    with ApiServer(items=LazyItems(120)).in_thread() as api:  # type: ignore[arg-type]
        cfg_path = write_config(tmp_path, api.url)
        result = CliRunner().invoke(app, ["collect", "news", "-c", str(cfg_path),
                                          "--pipeline-workers", "1"])
    assert result.exit_code == 0, result.output
    assert "news: SUCCEEDED" in result.stdout
    assert "requests" in result.stdout and "written 120" in result.stdout


async def test_ctrl_c_stops_the_cli_run_gracefully(tmp_path: Path) -> None:
    items = LazyItems(1000)
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        cfg_path = write_config(tmp_path, api.url)
        api.inject(Fault.slow(120), when=lambda r: r.query.get("offset") == "600")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from crawlhub.cli import main; main()",
            "collect", "news", "-c", str(cfg_path), "--no-progress",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await api.wait_for_requests(5, timeout=60)  # total, 900, 800, 700, 600 (hangs)
            proc.send_signal(signal.SIGINT)
            stdout, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 130
    assert "news: CANCELLED" in stdout.decode()
    assert sorted(jsonl_ids(tmp_path / "news.jsonl")) == list(range(700, 1000))

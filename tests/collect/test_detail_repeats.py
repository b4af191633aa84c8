"""``key: id`` in a JSON lines sink holds a job's list rows and detail rows: one line per
(record kind, id), across runs, after a Ctrl-C and after a SIGKILL mid-run (issue 18.6)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crawlhub.cli import app
from tests.collect.conftest import LazyItems, write_news_config
from tests.httpapi import ApiServer, Fault


def write_config(tmp_path: Path, url: str) -> Path:
    return write_news_config(
        tmp_path, url,
        # {{id}}: a literal {id} in a config file
        detail={"enabled": True, "url": f"{url}/items/{{{{id}}}}", "item_path": "item"},
        pipeline={"rate_min": 0, "rate_max": 0, "progress_interval": 0, "batch_size": 20},
        sink={"type": "jsonl", "path": str(tmp_path / "news.jsonl"), "key": "id"})


def lines_per_kind_and_id(path: Path) -> Counter[tuple[str, int]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return Counter((row.get("record_kind", "list"), row["id"]) for row in rows)


def collect(cfg_path: Path) -> None:
    result = CliRunner().invoke(app, ["collect", "news", "-c", str(cfg_path), "--json",
                                      "--no-progress"])
    assert result.exit_code == 0, result.output


def test_list_and_detail_rows_are_written_once_per_kind_and_id_across_runs(
    tmp_path: Path,
) -> None:
    items = LazyItems(150)
    with ApiServer(items=items).in_thread() as api:  # type: ignore[arg-type]
        cfg_path = write_config(tmp_path, api.url)
        collect(cfg_path)
        first = lines_per_kind_and_id(tmp_path / "news.jsonl")
        items.total = 170  # the second run re-reads the batch 70..169 below the boundary
        collect(cfg_path)
    counts = lines_per_kind_and_id(tmp_path / "news.jsonl")
    assert set(first.values()) == {1} and len(first) == 300
    assert set(counts.values()) == {1}
    assert sorted(counts) == sorted((kind, i) for kind in ("list", "detail") for i in range(170))


@pytest.mark.slow
async def test_a_run_killed_with_sigkill_mid_detail_writes_no_row_twice_after_resume(
    tmp_path: Path,
) -> None:
    items = LazyItems(300)
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        cfg_path = write_config(tmp_path, api.url)
        # total + 3 list pages, then details; the 70th detail request hangs
        api.inject(Fault.slow(120), nth=4 + 69)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from crawlhub.cli import main; main()",
            "collect", "news", "-c", str(cfg_path), "--no-progress",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            await api.wait_for_requests(4 + 70, timeout=60)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        killed = lines_per_kind_and_id(tmp_path / "news.jsonl")
        api.clear_faults()
        items.total = 330  # new items arrived while it was down
        await asyncio.to_thread(collect, cfg_path)
    counts = lines_per_kind_and_id(tmp_path / "news.jsonl")
    assert 300 + 40 <= sum(killed.values()) < 600  # killed mid-detail
    assert set(counts.values()) == {1}
    assert sorted(counts) == sorted((kind, i) for kind in ("list", "detail") for i in range(330))

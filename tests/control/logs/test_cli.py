"""``crawlhub logs``: search, JSON lines, follow (a real process), prune."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from crawlhub.cli import app
from crawlhub.control.logs import LogStore
from tests.control.logs.conftest import MakeLine

runner = CliRunner()


def cli(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["logs", *args, "--data-dir", str(tmp_path)])
    return result.exit_code, result.output


async def test_logs_prints_the_newest_matches_oldest_first(store: LogStore, line: MakeLine,
                                                           tmp_path: Path) -> None:
    await store.write([line("boot", ts=1714564800.25, job="news", run="r1", task="t1",
                            level="warning"),
                       line("fetch timeout [x]", ts=1714564801.0, job="news", level="error"),
                       line("elsewhere", job="shop")])
    code, output = await asyncio.to_thread(cli, tmp_path, "--job", "news")
    assert code == 0
    assert output.splitlines() == [
        "2024-05-01 12:00:00.250 WARNING  news/r1/t1 [job] boot",
        "2024-05-01 12:00:01.000 ERROR    news [job] fetch timeout [x]"]
    code, output = await asyncio.to_thread(cli, tmp_path, "-q", "timeout", "--json",
                                           "--level", "error")
    [row] = [json.loads(x) for x in output.splitlines()]
    assert code == 0 and row["message"] == "fetch timeout [x]" and row["job"] == "news"
    code, output = await asyncio.to_thread(cli, tmp_path, "--limit", "1")
    assert output.splitlines()[0].endswith("elsewhere")


async def test_logs_refuses_bad_options_with_a_reason(tmp_path: Path) -> None:
    code, output = await asyncio.to_thread(cli, tmp_path, "--level", "loud")
    assert code == 2 and "level='loud' is not a level" in output
    code, output = await asyncio.to_thread(cli, tmp_path, "--since", "someday")
    assert code == 2 and "--since='someday' is not a time" in output


async def test_logs_prune_applies_retention(store: LogStore, line: MakeLine,
                                            tmp_path: Path) -> None:
    await store.write([line("ancient", ts=time.time() - 7200), line("fresh")])
    result = await asyncio.to_thread(
        runner.invoke, app, ["logs", "prune", "--max-age", "1h", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0 and result.output.strip() == "deleted 1 lines; 1 left"
    code, output = await asyncio.to_thread(cli, tmp_path)
    assert output.strip().endswith("fresh") and "ancient" not in output
    result = await asyncio.to_thread(
        runner.invoke, app, ["logs", "prune", "--max-age", "soon", "--data-dir",
                             str(tmp_path)])
    assert result.exit_code == 2 and "--max-age" in result.output


async def test_logs_follow_prints_new_lines_as_they_come(store: LogStore, line: MakeLine,
                                                         tmp_path: Path) -> None:
    await store.write([line("already there", job="f")])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crawlhub", "logs", "--job", "f", "--follow", "--json",
        "--data-dir", str(tmp_path), stdout=subprocess.PIPE, env=env)
    try:
        assert process.stdout is not None
        first = await asyncio.wait_for(process.stdout.readline(), 15)
        assert json.loads(first)["message"] == "already there"
        await store.write([line("not mine", job="g"), line("new one", job="f")])
        second = await asyncio.wait_for(process.stdout.readline(), 10)
        assert json.loads(second)["message"] == "new one"
    finally:
        process.terminate()
        await process.wait()

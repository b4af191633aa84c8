"""CLI fixtures: ``crawlhub`` invoked in-process with typer's CliRunner, from a clean
working directory, and YAML config files written for the test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from crawlhub.cli import app

Cli = Callable[..., Result]


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``cli("lease", "default", input=...)``: run a command, return its Result
    (``exit_code``, ``stdout``, ``stderr``). Runs in ``tmp_path/work`` so no .env or data
    directory of the repository leaks in."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("CRAWLHUB_CONFIG", "CRAWLHUB_DATA_DIR", "CRAWLHUB_URL", "CRAWLHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(app, list(args), input=input, catch_exceptions=False)

    return invoke


def write_yaml(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False),
                    encoding="utf-8")
    return path


def one_line(text: str) -> str:
    """Console output with line breaks and runs of spaces folded (Rich wraps at 80)."""
    return " ".join(text.split())


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The rows of a Rich table by their first cell (folded first cells joined)."""
    rows: list[list[str]] = []
    for line in stdout.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if rows and not any(cells[1:]):
            rows[-1][0] += cells[0]
        else:
            rows.append(cells)
    return {cells[0]: cells[1:] for cells in rows}

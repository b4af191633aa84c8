"""Helpers for config tests: write a tree of YAML files, run from an empty directory."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

WriteFiles = Callable[..., Path]


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run every config test from an empty folder so no stray .env file leaks in."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


@pytest.fixture
def write(tmp_path: Path) -> WriteFiles:
    """``write({"main.yaml": "...", "config.d/a.yaml": "..."})`` -> path of the first file."""
    root = tmp_path / "conf"

    def _write(files: dict[str, str]) -> Path:
        first: Path | None = None
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
            first = first or path
        assert first is not None
        return first

    return _write

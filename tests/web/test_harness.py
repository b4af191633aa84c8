"""The browser tests never skip: without Chromium they fail and say how to install it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_without_chromium_the_browser_tests_fail_and_say_how_to_install_it(
        tmp_path: Path) -> None:
    env = {**os.environ, "CRAWLHUB_CHROMIUM": str(tmp_path / "no-chromium"),
           "CRAWLHUB_TEST_ARTIFACTS": str(tmp_path / "shots")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/web/test_pages.py", "-k", "log_out"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 1, run.stdout[-2000:]
    assert f"no Chromium at {tmp_path / 'no-chromium'}" in run.stdout
    assert "apt-get install chromium" in run.stdout
    assert "skipped" not in run.stdout and "1 error" in run.stdout

"""The README's control-plane walkthrough is ``examples/control_walkthrough.sh``, and it
runs as written: its own server on a free port and a temporary data directory, a git
repository with ``count.py``, a signed webhook, a build, a job run, paused, continued and
cancelled, its logs searched - each step checked by the script itself. Every command the
README shows of it is a line of the script."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.serving import crawlhub_command

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "control_walkthrough.sh"


def code(line: str) -> str:
    """A shell line without its trailing comment, stripped."""
    return re.split(r"\s+#\s", line, maxsplit=1)[0].strip()


def test_the_readme_shows_the_walkthrough_script_line_for_line() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Control plane: projects, builds, jobs, logs, web page", 1)[1]
    section = section.split("\n## ", 1)[0]
    assert "bash examples/control_walkthrough.sh" in section
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    shown = [code(line) for line in blocks[-1].splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    script = {code(line.replace("$CRAWLHUB", "crawlhub"))
              for line in SCRIPT.read_text().splitlines()}
    assert len(shown) > 15
    assert [line for line in shown if line not in script] == []


@pytest.mark.slow
def test_the_control_walkthrough_runs_as_written(tmp_path: Path) -> None:
    missing = [tool for tool in ("curl", "git") if shutil.which(tool) is None]
    if missing:  # never a silent skip: the README's walkthrough needs them
        pytest.fail(f"the walkthrough needs {' and '.join(missing)}: apt-get install"
                    f" {' '.join(missing)}", pytrace=False)
    command = crawlhub_command()
    crawlhub = command[0] if len(command) == 1 else f"{sys.executable} -m crawlhub"
    env = {**os.environ, "PYTHON": sys.executable, "CRAWLHUB": crawlhub,
           "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(["bash", str(SCRIPT)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:  # a hung step: its server goes too
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    assert "== the walkthrough passed" in out
    assert "run r" in out and ": cancelled" in out
    assert list(tmp_path.iterdir()) == []  # it cleaned up after itself

"""The README's control-plane walkthrough in containers is
``examples/control_walkthrough_containers.sh``, and it runs as written on the real engine:
the ``image`` builder makes the release tag an image, the job runs in a container of it,
is frozen by the engine and thawed, restarted into a fresh container, its logs searched,
and cancelled - each step checked by the script itself. Every command the README shows
of it is a line of the script."""

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
from tests.control.test_walkthrough import code

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "control_walkthrough_containers.sh"


def test_the_readme_shows_the_container_walkthrough_script_line_for_line() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Jobs and agents in containers", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert "bash examples/control_walkthrough_containers.sh" in blocks[0]
    shown = [code(line) for line in blocks[1].splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    script = {code(line) for line in SCRIPT.read_text().splitlines()}
    assert len(shown) > 10
    assert [line for line in shown if line not in script] == []


@pytest.mark.slow
def test_the_container_walkthrough_runs_as_written(tmp_path: Path, base_image: str) -> None:
    assert base_image == "localhost/crawlhub-base:1", "the script's BASE is this image"
    missing = [tool for tool in ("curl", "git") if shutil.which(tool) is None]
    assert not missing, f"the walkthrough needs {' and '.join(missing)}: apt-get install" \
                        f" {' '.join(missing)}"
    command = crawlhub_command()
    crawlhub = command[0] if len(command) == 1 else f"{sys.executable} -m crawlhub"
    env = {**os.environ, "PYTHON": sys.executable, "CRAWLHUB": crawlhub,
           "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(["bash", str(SCRIPT)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=290)
    finally:  # a hung step: its server goes too
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    assert "== the walkthrough passed" in out
    assert "an image, crawlhub/shop:1.0" in out
    assert ": cancelled" in out
    assert list(tmp_path.iterdir()) == []  # it cleaned up after itself

"""``crawlhub serve`` killed with SIGKILL while a build's ``setup.py`` runs (it sleeps 40 s,
as a slow native build would). Restarted on the same data, the server records the build
failed (interrupted), kills the ``setup.py`` the killed server left running, with its
whole process group, and removes the build's half-made directory."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from crawlhub.core.process import pid_alive
from tests.cli.serving import crawlhub_serve
from tests.control.gitremote import make_remote
from tests.control.served_api import call
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
async def test_a_server_killed_mid_build_leaves_no_build_process_and_no_half_made_directory(
        tmp_path: Path) -> None:
    started = tmp_path / "setup-started"
    setup_py = ("import os, pathlib, time\nfrom setuptools import setup\n"
                f"pathlib.Path({str(started)!r}).write_text(f'{{os.getpid()}} {{os.getpgrp()}}')\n"
                "time.sleep(40)\nsetup(name='slow', version='1.0')\n")
    remote = make_remote(tmp_path / "git", {"setup.py": setup_py}, tags=("release/slow/1.0",))
    data = tmp_path / "data"
    args = ["--data-dir", str(data)]
    log = tmp_path / "serve.log"
    pid = group = 0
    try:
        with crawlhub_serve(args, log=log) as served:
            call(served, "POST", "/projects/", {"name": "slow", "git_url": remote.url})
            build = call(served, "POST", "/projects/slow/builds", {"tag": "release/slow/1.0"})
            # pip install . -> the build backend -> setup.py, which says it started
            await wait_for(lambda: started.exists() and started.read_text().strip(),
                           "setup.py to start", timeout=120)
            pid, group = map(int, started.read_text().split())
            served.kill()
        half_made = data / "builds" / "slow" / f"1.0-{build['id']}"
        assert half_made.is_dir() and pid_alive(pid)  # the killed server's build runs on

        with crawlhub_serve(args, log=log) as served:
            after = call(served, "GET", f"/builds/{build['id']}")
            assert after["status"] == "failed" and "interrupted" in after["error"], after
            await wait_for(lambda: not group_alive(group), "setup.py's process group to be"
                           " killed", timeout=15)
            assert not pid_alive(pid)
            assert not half_made.exists()
            assert "ran on; killed them" in served.output()
    finally:
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

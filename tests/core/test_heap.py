"""The collector tuning of crawlhub's long-running commands (crawlhub.core.heap): only
in a process crawlhub's console script started, paused while a command starts, then
its start-up frozen and the youngest generation collected less often."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from crawlhub.cli import app
from crawlhub.core import heap


def test_a_command_run_inside_another_program_leaves_its_collector_alone(
        tmp_path: Path) -> None:
    before = gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()
    with heap.starting():
        assert gc.isenabled()
        heap.started()
    # a crawl run in this process (no console script): an unreachable start URL
    result = CliRunner().invoke(app, ["crawl", "http://127.0.0.1:9/", "--data-dir",
                                      str(tmp_path / "data"), "--out",
                                      str(tmp_path / "items.jsonl"), "--quiet"])
    assert result.exit_code in (0, 1), result.output
    assert (gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()) == before


def test_crawlhubs_own_process_pauses_the_collector_at_start_then_freezes_and_tunes_it(
        ) -> None:
    script = textwrap.dedent("""
        import gc
        from crawlhub.core import heap

        heap.own()
        with heap.starting():
            assert not gc.isenabled()
            built = [[i] for i in range(1000)]  # what start-up builds
            heap.started()
            assert gc.isenabled()
        assert gc.get_threshold()[0] == heap.YOUNG_THRESHOLD
        assert gc.get_freeze_count() >= len(built)
        try:
            with heap.starting():
                raise SystemExit(2)  # a command that ends before it started
        except SystemExit:
            pass
        assert gc.isenabled()  # the collector runs
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_console_script_owns_its_process() -> None:
    """``crawlhub.cli.main`` (the console script's entry) marks the process as crawlhub's
    before it runs the command."""
    script = textwrap.dedent("""
        import sys
        from crawlhub.core import heap
        from crawlhub import cli

        sys.argv = ["crawlhub", "--help"]
        try:
            cli.main()
        except SystemExit:
            pass
        print("owned" if heap._owned else "not owned")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "owned", done.stderr

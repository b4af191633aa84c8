"""``crawlhub jobs`` and ``crawlhub runs`` on the embedded control database: add, list,
run in the foreground (its lines printed, the exit code the run's), pause and continue
stored for the next run, the run history; refusals exit non-zero with the reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .conftest import Cli


def test_a_job_is_added_run_here_and_its_runs_listed(cli: Cli, tmp_path: Path) -> None:
    where = ["--data-dir", str(tmp_path / "data")]
    added = cli("jobs", "add", "hello", "--cron", "0 4 * * *", *where, "--",
                sys.executable, "-c", "print('hello from a job')")
    assert added.exit_code == 0, added.stderr
    assert added.stdout.startswith("added job hello; next tick ")

    [job] = json.loads(cli("jobs", "list", "--json", *where).stdout)
    assert job["spec"]["cron"] == "0 4 * * *" and job["desired"] == "run"

    ran = cli("jobs", "run", "hello", *where)
    assert ran.exit_code == 0, ran.stderr
    assert "hello from a job" in ran.stdout and "succeeded (exit 0)" in ran.stdout

    [run] = json.loads(cli("runs", "list", "--json", *where).stdout)
    assert (run["job"], run["status"], run["trigger"], run["exit_code"]) == (
        "hello", "succeeded", "cli", 0)
    shown = json.loads(cli("runs", "show", run["id"], "--json", *where).stdout)
    assert shown["run"]["id"] == run["id"]
    over = cli("runs", "cancel", run["id"], *where)
    assert over.exit_code != 0 and "succeeded: there is nothing to cancel" in over.stderr
    assert "no run 'nope'" in cli("runs", "cancel", "nope", *where).stderr

    assert cli("jobs", "pause", "hello", *where).exit_code == 0
    [job] = json.loads(cli("jobs", "list", "--json", *where).stdout)
    assert job["desired"] == "pause"
    assert cli("jobs", "continue", "hello", *where).exit_code == 0
    [job] = json.loads(cli("jobs", "list", "--json", *where).stdout)
    assert job["desired"] == "run"


def test_a_failing_run_and_bad_input_exit_non_zero(cli: Cli, tmp_path: Path) -> None:
    where = ["--data-dir", str(tmp_path / "data")]
    assert cli("jobs", "add", "boom", *where, "--", sys.executable, "-c",
               "import sys; sys.exit(4)").exit_code == 0
    ran = cli("jobs", "run", "boom", *where)
    assert ran.exit_code == 1 and "failed (exit 4)" in ran.stdout
    bad = cli("jobs", "add", "x", "--cron", "every day", *where, "--", "true")
    assert bad.exit_code != 0 and "cron" in bad.stderr
    missing = cli("jobs", "run", "nope", *where)
    assert missing.exit_code != 0 and "no job named 'nope'" in missing.stderr


def test_a_job_that_opts_out_of_pause_is_refused_by_the_cli(cli: Cli, tmp_path: Path) -> None:
    where = ["--data-dir", str(tmp_path / "data")]
    added = cli("jobs", "add", "steady", "--not-pausable", "--grace", "60", *where, "--",
                sys.executable, "-c", "print(1)")
    assert added.exit_code == 0, added.stderr
    [job] = json.loads(cli("jobs", "list", "--json", *where).stdout)
    assert job["spec"]["pausable"] is False and job["spec"]["grace"] == 60
    refused = cli("jobs", "pause", "steady", *where)
    assert refused.exit_code != 0 and "not pausable" in refused.stderr
    assert cli("jobs", "set", "steady", "--pausable", *where).exit_code == 0
    assert cli("jobs", "pause", "steady", *where).exit_code == 0


def test_a_container_job_is_described_by_flags_and_refused_when_wrong(
        cli: Cli, tmp_path: Path) -> None:
    """The container flags of ``jobs add`` and ``jobs set`` reach the job's spec, and a
    bad value is refused naming it (nothing is started: the runtime is not needed)."""
    where = ["--data-dir", str(tmp_path / "data")]
    added = cli("jobs", "add", "boxed", "--runtime", "container", "--image",
                "localhost/crawlhub-base:1", "--cpus", "1.5", "--memory", "256m", "--pids",
                "64", "--network", "bridge", *where, "--", "python3", "-c", "print(1)")
    assert added.exit_code == 0, added.stderr
    [job] = json.loads(cli("jobs", "list", "--json", *where).stdout)
    spec = job["spec"]
    assert (spec["runtime"], spec["image"], spec["cpus"], spec["memory"], spec["pids"],
            spec["network"]) == ("container", "localhost/crawlhub-base:1", 1.5, "256m", 64,
                                 "bridge")
    shown = cli("jobs", "show", "boxed", *where)
    assert "runtime container" in shown.stdout and "memory 256m" in shown.stdout

    assert cli("jobs", "set", "boxed", "--memory", "1g", "--network", "none",
               *where).exit_code == 0
    [job] = json.loads(cli("jobs", "list", "--json", *where).stdout)
    assert (job["spec"]["memory"], job["spec"]["network"]) == ("1g", "none")

    bad_memory = cli("jobs", "add", "x", "--runtime", "container", "--memory", "lots",
                     *where, "--", "true")
    assert bad_memory.exit_code != 0 and "memory 'lots'" in bad_memory.stderr
    bad_network = cli("jobs", "set", "boxed", "--network", "wifi", *where)
    assert bad_network.exit_code != 0 and "network" in bad_network.stderr
    bad_runtime = cli("jobs", "add", "y", "--runtime", "vm", *where, "--", "true")
    assert bad_runtime.exit_code != 0 and "runtime" in bad_runtime.stderr
    [job] = json.loads(cli("jobs", "list", "--json", *where).stdout)  # still just one
    assert job["spec"]["memory"] == "1g"

"""``crawlhub projects`` and ``crawlhub builds``: a project added with its password from
stdin (never shown again), built here from a local bare repository, its builds listed and
shown with their logs, then removed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import Cli
from tests.control.gitremote import make_remote

PASSWORD = "cli-pw-77Qz-secret"


def test_a_project_is_added_built_listed_and_removed(cli: Cli, tmp_path: Path) -> None:
    remote = make_remote(tmp_path / "git")
    data = ["--data-dir", str(tmp_path / "data")]
    added = cli("projects", "add", "demo", remote.url, "--username", "ci",
                "--password-stdin", "--generate-webhook-secret", *data,
                input=PASSWORD + "\n")
    assert added.exit_code == 0, added.stdout + added.stderr
    assert "set (encrypted)" in added.stdout and "/hooks/demo" in added.stdout
    secret = added.stdout.strip().splitlines()[-1]
    assert len(secret) >= 32 and "shown once" in added.stderr

    again = cli("projects", "add", "demo", remote.url, *data)
    assert again.exit_code == 1 and "exists already" in again.stderr
    bad = cli("projects", "add", "x", "ext::sh", *data)
    assert bad.exit_code == 2 and "transport helper" in bad.stderr

    built = cli("projects", "build", "demo", "--tag", "release/demo/1.0", *data)
    assert built.exit_code == 0, built.stdout + built.stderr
    assert "succeeded -> venv" in " ".join(built.stdout.split())
    assert "cloned release/demo/1.0" in built.stderr  # the log, as it ran
    failed = cli("projects", "build", "demo", "--tag", "release/demo/9", "--version", "9",
                 "-q", *data)
    assert failed.exit_code == 1 and "failed" in failed.stdout

    listed = cli("builds", "list", "--json", *data)
    builds = json.loads(listed.stdout)
    assert [(b["version"], b["status"], b["trigger"]) for b in builds] == [
        ("9", "failed", "cli"), ("1.0", "succeeded", "cli")]
    shown = cli("builds", "show", str(builds[1]["id"]), *data)
    assert shown.exit_code == 0 and "cloned release/demo/1.0" in shown.stdout
    project = json.loads(cli("projects", "show", "demo", "--json", *data).stdout)
    assert project["has_password"] and project["has_webhook_secret"]
    assert len(project["builds"]) == 2
    table = cli("projects", "list", *data)
    assert "demo" in table.stdout

    for result in (added, built, listed, shown, table):
        assert PASSWORD not in result.stdout + result.stderr
    removed = cli("projects", "remove", "demo", *data)
    assert removed.exit_code == 0
    assert json.loads(cli("projects", "list", "--json", *data).stdout) == []
    gone = cli("projects", "show", "demo", *data)
    assert gone.exit_code == 1 and "no project named 'demo'" in gone.stderr


def test_a_password_given_badly_is_refused_without_echoing_it(cli: Cli, tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    result = cli("projects", "add", "demo", "/srv/git/demo.git", "--password", "x" * 5000,
                 *data)
    assert result.exit_code == 2 and "password" in result.stderr
    assert "x" * 100 not in result.stdout + result.stderr
    both = cli("projects", "add", "demo", "/srv/git/demo.git", "--password", "a",
               "--password-stdin", *data, input="b\n")
    assert both.exit_code == 2 and "one way only" in both.stderr

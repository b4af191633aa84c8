"""``crawlhub submit`` against a real ``crawlhub serve`` subprocess: tasks from a JSON
lines file, a JSON array or stdin are routed, and ``crawlhub lease`` then hands them out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cli, one_line, table_rows, write_yaml
from .serving import Served, crawlhub_serve


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server on the built-in config for several tests (each drains what it queued)."""
    root = tmp_path_factory.mktemp("served")
    data_dir = root / "data"
    with crawlhub_serve(["--data-dir", str(data_dir)], log=root / "serve.log",
                        data_dir=data_dir) as served:
        yield served


def lease_all(cli: Cli, data_dir: Path | None) -> list[dict[str, Any]]:
    """Lease and ack everything in the ``default`` queue; the payloads."""
    assert data_dir is not None
    result = cli("lease", "default", "-n", "1000", "--data-dir", str(data_dir))
    assert result.exit_code == 0
    messages = [json.loads(line) for line in result.stdout.splitlines() if line]
    if messages:
        assert cli("ack", "default", *(m["id"] for m in messages),
                   "--data-dir", str(data_dir)).exit_code == 0
    return [m["payload"] for m in messages]


def numbers(payloads: list[dict[str, Any]]) -> list[int]:
    return sorted(int(p["n"]) for p in payloads)


def submitted(stdout: str) -> dict[str, str]:
    """The summary table: {"routed": "3", "duplicate": "0", ...}."""
    header = next(line for line in stdout.splitlines() if "routed" in line)
    names = [c.strip() for c in header.strip("┃").split("┃")]
    [(first, rest)] = table_rows(stdout).items()
    return dict(zip(names, [first, *rest], strict=True))


def test_tasks_from_a_jsonl_file_and_from_stdin_reach_the_queue(
        cli: Cli, server: Served, tmp_path: Path) -> None:
    lease_all(cli, server.data_dir)
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("".join(json.dumps({"url": f"https://example.com/{i}", "n": i}) + "\n"
                             for i in range(5)) + "\n")
    from_file = cli("submit", str(jsonl), "--url", server.url, "--batch", "2")
    assert from_file.exit_code == 0, from_file.stderr
    assert submitted(from_file.stdout)["routed"] == "5"
    stdin = "\n".join(json.dumps({"url": f"https://example.org/{i}", "n": 10 + i})
                      for i in range(3))
    from_stdin = cli("submit", "-", "--url", server.url, input=stdin)
    assert from_stdin.exit_code == 0, from_stdin.stderr
    assert submitted(from_stdin.stdout)["routed"] == "3"

    payloads = lease_all(cli, server.data_dir)
    assert numbers(payloads) == [0, 1, 2, 3, 4, 10, 11, 12]
    assert all(p["outbound"] == "default" and p["task_uuid"] for p in payloads)


def test_a_json_array_file_is_submitted_too(cli: Cli, server: Served, tmp_path: Path) -> None:
    lease_all(cli, server.data_dir)
    array = tmp_path / "tasks.json"
    array.write_text(json.dumps([{"n": 1}, {"n": 2}]))
    assert cli("submit", str(array), "--url", server.url).exit_code == 0
    assert numbers(lease_all(cli, server.data_dir)) == [1, 2]


def test_a_line_that_is_not_json_stops_before_anything_is_sent(
        cli: Cli, server: Served, tmp_path: Path) -> None:
    lease_all(cli, server.data_dir)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"n": 1}\n{"n": \n')
    result = cli("submit", str(bad), "--url", server.url)
    assert result.exit_code == 2
    assert "line 2" in one_line(result.stderr)
    assert lease_all(cli, server.data_dir) == []


def test_tasks_over_a_token_rate_are_resent_until_all_are_routed(
        cli: Cli, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "rated.yaml", {
        "data_dir": str(tmp_path / "data"),
        "outbound": [{"name": "default", "token_per_second": 4, "init": {"key": "default"}}]})
    tasks = "\n".join(json.dumps({"n": i}) for i in range(10))
    with crawlhub_serve(["-c", str(config)], log=tmp_path / "serve.log") as served:
        result = cli("submit", "-", "--url", served.url, input=tasks)
    assert result.exit_code == 0, result.stderr
    assert submitted(result.stdout)["routed"] == "10"
    assert numbers(lease_all(cli, tmp_path / "data")) == list(range(10))


def test_a_rejected_task_makes_submit_exit_1(cli: Cli, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "picky.yaml", {
        "data_dir": str(tmp_path / "data"),
        "outbound": [{"name": "default", "selector": ["url"], "init": {"key": "default"}}]})
    with crawlhub_serve(["-c", str(config)], log=tmp_path / "serve.log") as served:
        result = cli("submit", "-", "--url", served.url, input='{"url": "u"}\n{"no": 1}\n')
    assert result.exit_code == 1
    counts = submitted(result.stdout)
    assert (counts["routed"], counts["rejected"]) == ("1", "1")


def test_submit_prints_the_index_status_and_reason_of_every_task_not_taken(
        cli: Cli, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "picky.yaml", {
        "data_dir": str(tmp_path / "data"),
        "outbound": [{"name": "default", "selector": ["url"], "init": {"key": "default"}}]})
    tasks = '{"url": "u"}\n{"no": 1}\n{"url": "v"}\n{"no": 3}\n'
    with crawlhub_serve(["-c", str(config)], log=tmp_path / "serve.log") as served:
        result = cli("submit", "-", "--url", served.url, "--batch", "3", input=tasks)
    assert result.exit_code == 1
    assert submitted(result.stdout)["rejected"] == "2"
    rows = table_rows(result.stderr)
    assert rows == {"1": ["rejected", "no outbound's selector matched the task"],
                    "3": ["rejected", "no outbound's selector matched the task"]}
    assert "2 of 4 tasks not taken" in result.stderr


def test_the_server_token_is_sent_when_given(cli: Cli, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "locked.yaml", {
        "data_dir": str(tmp_path / "data"), "server": {"token": "s3cret-cli-8e1f0b27"},
        "outbound": [{"name": "default", "init": {"key": "default"}}]})
    with crawlhub_serve(["-c", str(config)], log=tmp_path / "serve.log") as served:
        refused = cli("submit", "-", "--url", served.url, input='{"n": 1}')
        accepted = cli("submit", "-", "--url", served.url, "--token", "s3cret-cli-8e1f0b27",
                       input='{"n": 2}')
    assert refused.exit_code == 1 and "401" in one_line(refused.stderr)
    assert accepted.exit_code == 0
    assert numbers(lease_all(cli, tmp_path / "data")) == [2]

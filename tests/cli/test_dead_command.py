"""``crawlhub dead QUEUE`` shows dead letters with the reason each died; ``nack --reason``
keeps the worker's reason; the delivery limit's reason shows the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crawlhub.config import default_config

from .conftest import Cli
from .test_queue_commands import leased, push


def lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_dead_shows_each_dead_letter_with_its_reason(cli: Cli, tmp_path: Path) -> None:
    opts = ["--data-dir", str(tmp_path / "data")]
    url = default_config(tmp_path / "data").storage.queues
    push(url, "crawlhub:", "jobs", [{"n": 1}, {"n": 2}])
    first, second = leased(cli("lease", "jobs", "-n", "2", *opts).stdout)

    cli("nack", "jobs", first["receipt"], "--dead", "--reason", "banned by the site", *opts)
    cli("nack", "jobs", second["receipt"], *opts)  # back to ready: not dead
    result = cli("dead", "jobs", *opts)

    assert result.exit_code == 0, result.stderr
    assert lines(result.stdout) == [{"id": first["id"], "attempts": 1,
                                     "reason": "banned by the site", "priority": 0,
                                     "payload": {"n": 1}}]


def test_a_message_nacked_back_ten_times_shows_the_delivery_limit_as_its_reason(
        cli: Cli, tmp_path: Path) -> None:
    opts = ["--data-dir", str(tmp_path / "data")]
    url = default_config(tmp_path / "data").storage.queues
    push(url, "crawlhub:", "jobs", [{"n": 1}])

    for _ in range(10):
        (m,) = leased(cli("lease", "jobs", *opts).stdout)
        assert cli("nack", "jobs", m["receipt"], *opts).exit_code == 0

    assert cli("lease", "jobs", *opts).stdout.strip() == ""
    (dead,) = lines(cli("dead", "jobs", *opts).stdout)
    assert (dead["attempts"], dead["reason"]) == (10, "delivered 10 times without ack")


def test_route_refuses_a_task_nested_past_the_depth_limit(cli: Cli, tmp_path: Path) -> None:
    from crawlhub.core.jsoncodec import MAX_DEPTH

    opts = ["--set", f"data_dir={tmp_path / 'data'}"]
    for depth in (MAX_DEPTH + 1, 5000):
        task = '{"url":"http://a/","d":' + '{"a":' * (depth - 1) + "1" + "}" * depth
        path = tmp_path / "deep.json"
        path.write_text(task)

        result = cli("route", str(path), *opts)

        assert result.exit_code == 2
        assert f"more than {MAX_DEPTH} levels deep" in result.stderr
        assert "Traceback" not in result.stderr


def test_submit_of_a_file_nested_past_the_parser_is_a_one_line_error(cli: Cli,
                                                                       tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"url":"http://a/","d":' + '{"a":' * 4999 + "1" + "}" * 5000)

    result = cli("submit", str(path), "--url", "http://127.0.0.1:9")

    assert result.exit_code == 2
    assert "levels deep" in result.stderr and "Traceback" not in result.stderr

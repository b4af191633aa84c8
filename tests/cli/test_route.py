"""``crawlhub route``: a dry run printing the outbound that would take a task and the
exact params it would send (exit 0), or why none would (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crawlhub.core.task import BUILTIN_KEYS

from .conftest import Cli, one_line, table_rows, write_yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "taskhub" / "main.yaml"
GD_TASK = {"task_src": 3, "data_type": "change", "task_parms": {"province": "GD"},
           "company_name": "深圳某某科技有限公司", "credit_no": "91440300MA5EXAMPLE",
           "detail_url": "", "rt": True}


@pytest.fixture
def selective(tmp_path: Path) -> Path:
    return write_yaml(tmp_path / "selective.yaml", {
        "data_dir": str(tmp_path / "data"),
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": [
            {"name": "gd", "selector": ["province == 'GD'"], "init": {"key": "gd"},
             "task_params": ["company_name"], "task_params_wrapped": True, "task_src": 3},
            {"name": "js", "selector": ["province == 'JS'"], "init": {"key": "js"}},
        ]})


def test_the_seed_task_routes_to_the_captcha_outbound_with_its_params(
        cli: Cli, tmp_path: Path) -> None:
    result = cli("route", json.dumps(GD_TASK), "-c", str(EXAMPLE),
                 "--set", f"data_dir={tmp_path / 'data'}")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["outbound"] == "zongju_captcha_ts3"
    assert report["selector"].startswith("task_src in [3] and not detail_url")
    params = report["params"]
    assert params["company_name"] == GD_TASK["company_name"]
    assert params["task_src"] == 3 and params["task_type"] == "破码"
    assert params["priority"] == 2000  # rt: rt_priority
    assert "detail_url" not in params  # not in the outbound's task_params
    assert set(BUILTIN_KEYS) <= set(params)


def test_wrapped_params_are_shown_under_task_params(cli: Cli, selective: Path) -> None:
    result = cli("route", '{"province": "GD", "company_name": "ACME", "x": 1}',
                 "-c", str(selective))
    assert result.exit_code == 0
    params = json.loads(result.stdout)["params"]
    assert list(params) == ["task_params"]
    assert params["task_params"]["company_name"] == "ACME"
    assert params["task_params"]["task_src"] == 3 and "x" not in params["task_params"]


def test_a_task_nothing_takes_exits_1_with_each_outbounds_reason(cli: Cli,
                                                                selective: Path) -> None:
    result = cli("route", '{"province": "ZJ"}', "-c", str(selective))
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["outbound"] is None and "no outbound" in report["reason"]
    assert [(c["outbound"], c["matched"]) for c in report["candidates"]] == [
        ("gd", False), ("js", False)]


def test_the_task_can_come_from_a_file_or_stdin(cli: Cli, selective: Path,
                                                tmp_path: Path) -> None:
    task_file = tmp_path / "task.json"
    task_file.write_text('{"province": "JS"}')
    from_file = cli("route", str(task_file), "-c", str(selective))
    from_stdin = cli("route", "-", "-c", str(selective), input='{"province": "JS"}')
    assert json.loads(from_file.stdout)["outbound"] == "js"
    assert json.loads(from_stdin.stdout)["outbound"] == "js"


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"a string"'])
def test_text_that_is_not_a_json_object_exits_2(cli: Cli, selective: Path, text: str) -> None:
    result = cli("route", text, "-c", str(selective))
    assert result.exit_code == 2
    assert "JSON" in one_line(result.stderr)


def test_route_writes_no_queue_message(cli: Cli, selective: Path) -> None:
    assert cli("route", '{"province": "GD"}', "-c", str(selective)).exit_code == 0
    result = cli("queues", "-c", str(selective))
    assert result.exit_code == 0
    assert table_rows(result.stdout) == {}  # no queue was even created


def test_a_class_the_hub_cannot_load_exits_2_naming_the_entry(cli: Cli, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "badclass.yaml", {
        "data_dir": str(tmp_path / "data"),
        "outbound": [{"name": "custom", "class": "no_such_pkg.Outbound"}]})
    result = cli("route", '{"a": 1}', "-c", str(config))
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert "outbound[0] 'custom'" in message and "no_such_pkg" in message

"""``crawlhub check-config``: the merged, resolved config as YAML (exit 0), or every
error with its file, entry and key (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from crawlhub.config import dump_config, load_config

from .conftest import Cli, one_line, write_yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "taskhub" / "main.yaml"


def test_the_taskhub_example_prints_as_resolved_yaml(cli: Cli,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_URL", "CRAWLHUB_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)  # so the example's .env is what counts
    result = cli("check-config", str(EXAMPLE))
    assert result.exit_code == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed == dump_config(load_config(EXAMPLE))
    assert [o["name"] for o in printed["outbound"]] == ["zongju_captcha_ts3", "default"]
    assert printed["inbound"][1]["init"]["url"] == "redis://127.0.0.1:6379/0"  # from .env
    assert printed["failure"]["path"].endswith("taskhub_demo-failures.jsonl")


def test_long_values_are_printed_on_one_line(cli: Cli, tmp_path: Path) -> None:
    selector = "url == 'https://example.com/" + "long/" * 30 + "'"
    config = write_yaml(tmp_path / "main.yaml", {
        "outbound": [{"name": "o", "selector": [selector]}]})
    result = cli("check-config", str(config))
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["outbound"][0]["selector"] == [selector]


def test_secrets_are_masked(cli: Cli, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "main.yaml", {
        "server": {"token": "tok-very-secret"},
        "outbound": [{"name": "o", "class": "redis_list",
                      "init": {"url": "redis://:pw-very-secret@127.0.0.1:6379/0", "key": "k"}}]})
    result = cli("check-config", str(config))
    assert result.exit_code == 0
    assert "very-secret" not in result.stdout


def test_a_bad_value_in_an_included_file_names_file_entry_and_key(cli: Cli,
                                                                 tmp_path: Path) -> None:
    main = write_yaml(tmp_path / "main.yaml", {"include": ["config.d"], "project": "p"})
    write_yaml(tmp_path / "config.d" / "10_ok.yaml", {"outbound": [{"name": "fine"}]})
    write_yaml(tmp_path / "config.d" / "20_bad.yaml", {"outbound": [
        {"name": "first"}, {"name": "broken", "retry_limits": "often"}]})
    result = cli("check-config", str(main))
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert "config.d/20_bad.yaml" in message
    assert "outbound[1] 'broken'" in message
    assert "retry_limits" in message
    assert result.stdout == ""


def test_every_error_is_listed_at_once(cli: Cli, tmp_path: Path) -> None:
    main = write_yaml(tmp_path / "main.yaml", {
        "server": {"port": 0},
        "outbound": [{"name": "a", "selector": ["__import__('os')"]},
                     {"name": "b", "init": {"url": "{nowhere_defined}"}}]})
    result = cli("check-config", str(main))
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert "port" in message
    assert "outbound[0] 'a'" in message and "__import__" in message
    assert "outbound[1] 'b'" in message and "nowhere_defined" in message


def test_a_class_the_hub_cannot_build_is_a_config_error(cli: Cli, tmp_path: Path) -> None:
    main = write_yaml(tmp_path / "main.yaml", {"inbound": [
        {"name": "in", "class": "http", "convert": ["no_such_module.Converter"]}]})
    result = cli("check-config", str(main))
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert "inbound[0] 'in'" in message and "convert[0]" in message


def test_a_missing_file_is_exit_2(cli: Cli, tmp_path: Path) -> None:
    result = cli("check-config", str(tmp_path / "absent.yaml"))
    assert result.exit_code == 2
    assert "does not exist" in one_line(result.stderr)


def test_an_error_quoting_brackets_prints_them_as_written(cli: Cli, tmp_path: Path) -> None:
    selector = "task_parms[province] == 1 and [x for x in y] or z == '[/b]'"
    main = write_yaml(tmp_path / "main.yaml", {"outbound": [{"name": "a",
                                                            "selector": [selector]}]})
    result = cli("check-config", str(main))
    assert result.exit_code == 2
    assert selector in result.stderr

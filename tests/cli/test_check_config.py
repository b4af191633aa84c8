"""``crawlhub check-config``: the merged, resolved config as YAML (exit 0), or every
error with its file, entry and key (exit 2)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

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
        "server": {"token": "tok-very-secret-4d2a"},
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


USER_CODE = '''
import pathlib

MARKER = pathlib.Path(__file__).with_name("constructed.txt")


def _touch(what):
    with MARKER.open("a") as fh:
        fh.write(what + "\\n")


class Outbound:
    def __init__(self, name, init, queues):
        _touch("outbound")

    async def send(self, items): ...
    async def lag(self): return 0
    async def close(self): ...


class Converter:
    def __init__(self, field="x"):
        _touch("converter")

    def __call__(self, data):
        return data


class Source:
    def __init__(self, name, init, *, threads=1):
        _touch("inbound")

    async def run(self, deliver, stop): ...


class NoSend:
    def __init__(self, name, init, queues): ...


class FixedInit:
    def __init__(self, name, queues): ...
    async def send(self, items): ...
    async def lag(self): return 0
    async def close(self): ...


NOT_A_CLASS = 42
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of user classes whose constructors leave a marker file; its name."""
    name = f"userplug_{uuid.uuid4().hex}"
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{name}.py").write_text(USER_CODE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    return name


def test_check_config_imports_user_classes_but_never_constructs_them(
        cli: Cli, tmp_path: Path, user_module: str) -> None:
    main = write_yaml(tmp_path / "main.yaml", {
        "inbound": [{"name": "in", "class": f"{user_module}:Source", "init": {"a": 1},
                     "convert": [{"class": f"{user_module}:Converter", "init": {"field": "y"}}]}],
        "outbound": [{"name": "out", "class": f"{user_module}:Outbound", "init": {"k": 1}}]})
    result = cli("check-config", str(main))
    assert result.exit_code == 0, result.stderr
    assert user_module in sys.modules  # imported and checked ...
    assert not (tmp_path / "plugins" / "constructed.txt").exists()  # ... never constructed


@pytest.mark.parametrize(("entry", "key", "expected"), [
    ({"outbound": [{"name": "o", "class": "{m}:NoSend"}]}, "class",
     "outbound class '{m}:NoSend' has no send(), lag(), close()"),
    ({"outbound": [{"name": "o", "class": "{m}:FixedInit"}]}, "class",
     "cannot be called with (name=, init=, queues=)"),
    ({"outbound": [{"name": "o", "class": "{m}:NOT_A_CLASS"}]}, "class",
     "is 42 (int), not a class or function"),
    ({"outbound": [{"name": "o", "class": "{m}:Missing"}]}, "class", "has no 'Missing'"),
    ({"inbound": [{"name": "o", "class": "http",
                   "convert": [{"class": "{m}:Converter", "init": {"colour": 1}}]}]},
     "convert[0].init", "converter '{m}:Converter' cannot be called with (colour=)"),
    ({"inbound": [{"name": "o", "class": "{m}:Outbound"}]}, "class",
     "inbound class '{m}:Outbound' has no run()"),
    ({"outbound": [{"name": "o", "class": "redis_list", "init": {"url": "redis://h/0"}}]},
     "init.key", "redis_list outbound needs init.key"),
    ({"outbound": [{"name": "o", "class": "queue", "init": {"url": "mongodb://h/0"}}]},
     "init.url", "mongodb://"),
])
def test_a_class_of_the_wrong_kind_is_reported_without_constructing_anything(
        cli: Cli, tmp_path: Path, user_module: str, entry: dict[str, Any], key: str,
        expected: str) -> None:
    main = write_yaml(tmp_path / "main.yaml", json.loads(json.dumps(entry).replace("{m}",
                                                                              user_module)))
    result = cli("check-config", str(main))
    assert result.exit_code == 2, result.stdout
    message = one_line(result.stderr)
    section = next(iter(entry))
    assert f"file main.yaml, entry {section}[0] 'o', key '{key}'" in message
    assert expected.replace("{m}", user_module) in message
    assert not (tmp_path / "plugins" / "constructed.txt").exists()


def test_every_class_error_is_listed_at_once(cli: Cli, tmp_path: Path, user_module: str) -> None:
    main = write_yaml(tmp_path / "main.yaml", {"outbound": [
        {"name": "a", "class": f"{user_module}:NoSend"},
        {"name": "b", "class": "no_such_module_xyz:Out"}]})
    result = cli("check-config", str(main))
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert "outbound[0] 'a'" in message and "outbound[1] 'b'" in message


SINK_CODE = '''
import pathlib

MARKER = pathlib.Path(__file__).with_name("constructed.txt")


class Sink:
    def __init__(self, name, key, path):
        MARKER.write_text("sink")

    async def open(self): ...
    async def write_batch(self, records): ...
    async def close(self): ...
'''


def _job(sink: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": [{"name": "news", "source": {
        "url": "http://127.0.0.1:9/api", "items_path": "items", "total_path": "total",
        "id_field": "id"}, "sink": sink}]}


def test_a_job_sink_class_is_checked_but_not_constructed(cli: Cli, tmp_path: Path,
                                                         user_module: str) -> None:
    (tmp_path / "plugins" / f"{user_module}.py").write_text(SINK_CODE, encoding="utf-8")
    main = write_yaml(tmp_path / "main.yaml", _job({"type": f"{user_module}:Sink", "path": "x"}))
    result = cli("check-config", str(main))
    assert result.exit_code == 0, result.stderr
    assert not (tmp_path / "plugins" / "constructed.txt").exists()

    main = write_yaml(tmp_path / "main.yaml", _job({"type": f"{user_module}:Sink", "colour": 1}))
    result = cli("check-config", str(main))
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert "file main.yaml, entry job 'news' sink, key 'type'" in message
    assert "cannot be called with (name=, key=, colour=)" in message
    assert not (tmp_path / "plugins" / "constructed.txt").exists()


def test_a_job_sink_that_is_not_importable_is_reported(cli: Cli, tmp_path: Path) -> None:
    main = write_yaml(tmp_path / "main.yaml", {"include": ["jobs.yaml"]})
    write_yaml(tmp_path / "jobs.yaml", _job({"type": "no_such_sink_module:Sink"}))
    result = cli("check-config", str(main))
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert "file jobs.yaml, entry job 'news' sink, key 'type'" in message
    assert "cannot import module 'no_such_sink_module'" in message


FRONTIER_CODE = '''
def key_of(seed):
    return seed.url


def two_args(seed, other):
    return seed.url


class Segments:
    def __init__(self, seconds):
        raise AssertionError("constructed during check-config")

    def segment_of(self, when): ...
    def start_of(self, segment): ...
    def label(self, segment): ...


class NotSegments:
    def __init__(self, seconds): ...
'''


@pytest.mark.parametrize(("frontier", "key", "expected"), [
    ({"key": {"function": "{m}:key_of"}, "segment_resolver": "{m}:Segments"}, None, None),
    ({"key": {"function": "{m}:two_args"}}, "key.function", "cannot be called with (seed)"),
    ({"key": {"function": "{m}:nothing"}}, "key.function", "has no 'nothing'"),
    ({"segment_resolver": "{m}:NotSegments"}, "segment_resolver",
     "has no segment_of(), start_of(), label()"),
])
def test_frontier_functions_are_checked_without_being_called(
        cli: Cli, tmp_path: Path, user_module: str, frontier: dict[str, Any], key: str | None,
        expected: str | None) -> None:
    (tmp_path / "plugins" / f"{user_module}.py").write_text(FRONTIER_CODE, encoding="utf-8")
    spec = json.loads(json.dumps(frontier).replace("{m}", user_module))
    main = write_yaml(tmp_path / "main.yaml", {"include": ["frontiers.yaml"]})
    write_yaml(tmp_path / "frontiers.yaml", {"frontier": {"web": spec}})
    result = cli("check-config", str(main))
    if expected is None:
        assert result.exit_code == 0, result.stderr
        return
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert f"file frontiers.yaml, entry frontier 'web', key '{key}'" in message
    assert expected in message

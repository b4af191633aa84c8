"""Building the hub is split from running it: ``compile_config`` checks and compiles a
config without opening or constructing anything, and ``Hub.from_plan`` builds on it."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core.errors import ConfigError, ConfigErrors
from crawlhub.hub.hub import Hub
from crawlhub.hub.plan import compile_config
from crawlhub.hub.state import open_state
from crawlhub.queues import open_backend

USER_CODE = '''
import pathlib

MARKER = pathlib.Path(__file__).with_name("constructed.txt")


class Converter:
    def __init__(self, field):
        MARKER.write_text("converter")

    def __call__(self, message):
        return message


class Outbound:
    def __init__(self, name, init, queues):
        MARKER.write_text("outbound")

    async def send(self, items): ...
    async def lag(self): return 0
    async def close(self): ...
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"planplug_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(USER_CODE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def config(tmp_path: Path, **sections: Any) -> CrawlhubConfig:
    storage = tmp_path / "storage"  # never created by a compile
    return CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path),
        "storage": {"queues": f"sqlite:///{storage}/queues.db",
                    "state": "redis://127.0.0.1:1/0",  # nothing listens: never dialled
                    "frontier": f"sqlite:///{storage}/frontier.db"},
        "failure": {"path": str(storage / "failures.jsonl")}, **sections})


def test_compile_checks_everything_and_opens_or_constructs_nothing(
        tmp_path: Path, user_module: str) -> None:
    plan = compile_config(config(
        tmp_path,
        inbound=[{"name": "http", "class": "http", "selector": ["kind == 'a'"],
                  "convert": [{"class": f"{user_module}:Converter", "init": {"field": "x"}}]}],
        outbound=[{"name": "gd", "selector": ["province == 'GD'"], "init": {"key": "gd"}},
                  {"name": "mine", "class": f"{user_module}:Outbound"},
                  {"name": "rest", "init": {"key": "rest"}}]))

    assert [rule.name for rule in plan.router.rules] == ["gd", "mine", "rest"]
    assert plan.router.route({"province": "GD"}).outbound is plan.outbounds[0].rule
    [http] = plan.inbounds
    assert http.selectors.matches({"kind": "a"}) and not http.selectors.matches({"kind": "b"})
    assert [(c.class_name, c.init, c.key) for c in http.converters] == [
        (f"{user_module}:Converter", {"field": "x"}, "convert[0]")]
    assert user_module in sys.modules  # imported and checked ...
    assert not (tmp_path / "constructed.txt").exists()  # ... never constructed
    assert not (tmp_path / "storage").exists()  # no queue, state or failure file


def test_compile_lists_every_problem_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigErrors) as caught:
        compile_config(config(tmp_path, outbound=[
            {"name": "a", "class": "no_such_module_xyz:Out"},
            {"name": "b", "frontier": "web", "init": {"key": "b"}}]))

    assert [(e.entry, e.key) for e in caught.value.errors] == [
        ("outbound 'a'", "class"), ("outbound 'b'", "frontier")]


async def test_a_hub_is_built_from_the_compiled_plan(tmp_path: Path, user_module: str) -> None:
    cfg = config(tmp_path, inbound=[{"name": "http", "class": "http", "convert": [
        {"class": f"{user_module}:Converter", "init": {"field": "x"}}]}],
                 outbound=[{"name": "rest", "init": {"key": "rest"}}])
    cfg.storage.state = f"sqlite:///{tmp_path}/hub.db"
    plan = compile_config(cfg)
    queues = open_backend(cfg.storage.queues)
    state = open_state(cfg.storage.state)
    try:
        hub = Hub.from_plan(plan, queues=queues, state=state)
        assert hub.router is plan.router
        assert (tmp_path / "constructed.txt").read_text() == "converter"  # built now
        [result] = await hub.submit([{"url": "https://a.example/"}])
        assert (result.status, result.outbound) == ("routed", "rest")
        await hub.stop()
    finally:
        await state.close()
        await queues.close()


def test_the_hub_refuses_a_frontier_it_was_not_given(tmp_path: Path) -> None:
    plan = compile_config(config(tmp_path, frontier={"web": {"expected_items": 1000}},
                                 outbound=[{"name": "pages", "frontier": "web",
                                            "init": {"key": "pages"}}]))
    with pytest.raises(ConfigError, match="frontier 'web' is not defined") as caught:
        Hub.from_plan(plan, queues=None, state=None, frontiers={})  # type: ignore[arg-type]
    assert caught.value.entry == "outbound 'pages'"

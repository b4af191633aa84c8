"""``crawlhub agents``: the registered agents with their liveness, as a table or JSON, on
the embedded backend and on Redis (``storage.agents``, by default ``storage.state``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from crawlhub.agents.registry import AgentInfo, Heartbeat, open_registry
from crawlhub.config import default_config

from .conftest import Cli, one_line, table_rows, write_yaml


@pytest.fixture(params=["sqlite", "redis"])
def where(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
          ) -> Iterator[tuple[list[str], str, str]]:
    """(CLI options naming the storage, agents URL, key prefix) on each backend."""
    if request.param == "sqlite":
        data_dir = tmp_path / "data"
        yield ["--data-dir", str(data_dir)], default_config(data_dir).storage.state, "crawlhub:"
        return
    url = request.getfixturevalue("redis_url")
    prefix = f"{unique_name}:"
    config = write_yaml(tmp_path / "redis.yaml", {
        "data_dir": str(tmp_path / "data"),
        "storage": {"agents": url, "redis_prefix": prefix}})
    yield ["-c", str(config)], url, prefix
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=500))
    if keys:
        client.delete(*keys)
    client.close()


def register(url: str, prefix: str, agent_id: str, *, ago: float = 0.0,
             beat: Heartbeat | None = None) -> None:
    async def go() -> None:
        registry = open_registry(url, prefix=prefix, clock=lambda: time.time() - ago)
        try:
            await registry.register(AgentInfo(agent_id=agent_id, host="box", pid=99,
                                              version="0.1", queues=["spider"],
                                              concurrency=64))
            if beat is not None:
                await registry.heartbeat(agent_id, beat)
        finally:
            await registry.close()

    asyncio.run(go())


def test_agents_are_shown_alive_or_dead_with_their_load(
        cli: Cli, where: tuple[list[str], str, str]) -> None:
    opts, url, prefix = where
    register(url, prefix, "fresh", beat=Heartbeat(in_flight=5, qps=3.25, pages=120,
                                                  errors=2, memory=50 * 2**20, cpu=12))
    register(url, prefix, "silent", ago=300)
    result = cli("agents", *opts)
    assert result.exit_code == 0
    assert "1 alive, 1 dead" in one_line(result.stdout)
    rows = table_rows(result.stdout)
    assert rows["fresh"][:3] == ["box", "99", "alive"]
    assert rows["fresh"][4:10] == ["5/64", "3.2", "120", "2", "50", "12"]
    assert rows["silent"][2] == "dead" and rows["silent"][4] == "-"


def test_json_is_the_api_listing(cli: Cli, where: tuple[list[str], str, str]) -> None:
    opts, url, prefix = where
    register(url, prefix, "a1", beat=Heartbeat(pages=7))
    body = json.loads(cli("agents", "--json", *opts).stdout)
    assert body["alive"] == 1 and body["dead"] == 0 and body["dead_after"] == 11
    [row] = body["agents"]
    assert row["agent_id"] == "a1" and row["pages"] == 7 and row["alive"] is True


def test_an_agent_id_with_markup_is_printed_as_text(
        cli: Cli, where: tuple[list[str], str, str]) -> None:
    opts, url, prefix = where
    register(url, prefix, "[red]x[/]")
    assert "[red]x[/]" in table_rows(cli("agents", *opts).stdout)

"""``GET /agents/``: registered agents with their liveness, on SQLite and real Redis; the
registry lives on ``storage.agents`` (by default the hub state's backend)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from crawlhub.agents.registry import AgentInfo, Heartbeat, open_registry
from crawlhub.config.schema import CrawlhubConfig
from tests.api.conftest import MakeApi


def info(agent_id: str) -> AgentInfo:
    return AgentInfo(agent_id=agent_id, host="box", pid=7, version="0.1", queues=["q"],
                     started=1.0, concurrency=32)


async def test_agents_are_listed_with_liveness_and_their_last_heartbeat(
        make_api: MakeApi) -> None:
    api = await make_api()
    cfg = api.svc.config.storage
    # A registry whose clock runs 100 s behind registers an agent already silent that long.
    past = open_registry(cfg.agents_url, prefix=cfg.redis_prefix,
                         clock=lambda: time.time() - 100)
    try:
        await past.register(info("old"))
    finally:
        await past.close()
    await api.svc.agents.register(info("new"))
    await api.svc.agents.heartbeat("new", Heartbeat(pages=12, in_flight=3, qps=4.5))

    body = (await api.client.get("/agents/")).json()
    assert body["dead_after"] == 11 and body["alive"] == 1 and body["dead"] == 1
    rows = {r["agent_id"]: r for r in body["agents"]}
    assert rows["new"]["alive"] is True and rows["new"]["pages"] == 12
    assert rows["new"]["beats"] is True and rows["new"]["queues"] == ["q"]
    assert rows["old"]["alive"] is False and rows["old"]["beats"] is False

    live = (await api.client.get("/agents/", params={"alive": "true"})).json()
    assert [r["agent_id"] for r in live["agents"]] == ["new"]
    dead = (await api.client.get("/agents/", params={"alive": "false"})).json()
    assert [r["agent_id"] for r in dead["agents"]] == ["old"]


async def test_no_agents_is_an_empty_list(make_api: MakeApi) -> None:
    api = await make_api()
    response = await api.client.get("/agents/")
    assert response.status_code == 200
    assert response.json() == {"dead_after": 11.0, "alive": 0, "dead": 0, "agents": []}


async def test_a_bad_filter_is_a_422_with_a_json_body(make_api: MakeApi) -> None:
    api = await make_api()
    response = await api.client.get("/agents/", params={"alive": "perhaps"})
    assert response.status_code == 422 and "detail" in response.json()


def test_storage_agents_defaults_to_the_state_backend_and_can_be_set(tmp_path: Path) -> None:
    default = CrawlhubConfig.model_validate({"data_dir": str(tmp_path)})
    assert default.storage.agents is None
    assert default.storage.agents_url == default.storage.state
    own = CrawlhubConfig.model_validate(
        {"data_dir": str(tmp_path), "storage": {"agents": "redis://127.0.0.1:6379/0"}})
    assert own.storage.agents_url == "redis://127.0.0.1:6379/0"


def test_a_storage_agents_url_of_another_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="storage URL"):
        CrawlhubConfig.model_validate(
            {"data_dir": str(tmp_path), "storage": {"agents": "postgresql://h/db"}})

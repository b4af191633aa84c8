"""The rest of the API surface: inbound push errors, queue stats and lease / ack / nack
over HTTP, metrics, health, JSON 404/405 and the OpenAPI document; and one real socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import uvicorn

from crawlhub.app.asgi import create_app
from tests.helpers import wait_for
from tests.servers import free_port

from .conftest import Api, MakeApi


@pytest.fixture
async def api(make_api: MakeApi, redis_url: str, unique_name: str) -> Api:
    return await make_api(inbound=[
        {"name": "http", "class": "http"},
        {"name": "logs", "class": "redis", "init": {"url": redis_url,
                                                    "key": f"{unique_name}:logs"}},
        {"name": "closed", "class": "http", "disable": True},
    ])


async def test_pushing_into_an_unknown_inbound_is_404(api: Api) -> None:
    for path in ("/inbound/nope/", "/inbound/nope/check_task/"):
        r = await api.client.post(path, json={"url": "x"})
        assert r.status_code == 404
        assert "no inbound named 'nope'" in r.json()["detail"]


async def test_pushing_into_a_non_http_inbound_is_409(api: Api) -> None:
    r = await api.client.post("/inbound/logs/", json={"url": "x"})
    assert r.status_code == 409 and "redis" in r.json()["detail"]
    assert await api.queued("default") == 0


async def test_pushing_into_a_disabled_inbound_is_409(api: Api) -> None:
    r = await api.client.post("/inbound/closed/", json={"url": "x"})
    assert r.status_code == 409 and "disabled" in r.json()["detail"]


async def test_messages_pushed_into_an_http_inbound_are_routed(api: Api) -> None:
    r = await api.client.post("/inbound/http/", json=[{"url": "a"}, {"url": "b"}])
    assert r.status_code == 200
    assert [m["status"] for m in r.json()["messages"]] == ["routed", "routed"]
    assert await api.queued("default") == 2


async def test_inbounds_are_listed(api: Api) -> None:
    r = await api.client.get("/inbound/")
    assert [(i["name"], i["class"], i["disabled"]) for i in r.json()] == [
        ("http", "http", False), ("logs", "redis", False), ("closed", "http", True)]


def stat(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [r for r in rows if r["name"] == name]
    return found


async def test_queue_stats_follow_lease_ack_and_nack(api: Api) -> None:
    await api.client.post("/task/", json=[{"n": i} for i in range(4)])
    assert stat((await api.client.get("/queues/")).json(), "default") == {
        "name": "default", "total": 4, "left": 4, "ready": 4, "leased": 0, "success": 0,
        "failed": 0, "retried": 0, "dead": 0, "max_attempts": 10,
        "failed_by_reason": {"max_attempts": 0, "undeliverable": 0, "nacked": 0}}
    leased = (await api.client.post("/queues/default/lease",
                                     json={"n": 3, "visibility_timeout": 30})).json()
    assert [m["payload"]["n"] for m in leased] == [0, 1, 2]
    assert all(m["attempts"] == 1 for m in leased)
    ids = [m["id"] for m in leased]
    assert (await api.client.post("/queues/default/ack", json={"ids": ids[:1]})).json() == {
        "acked": 1}
    assert (await api.client.post("/queues/default/nack", json={"ids": ids[1:2]})).json() == {
        "nacked": 1}
    assert (await api.client.post("/queues/default/nack",
                                  json={"ids": ids[2:], "dead": True})).json() == {"nacked": 1}
    assert stat((await api.client.get("/queues/")).json(), "default") == {
        "name": "default", "total": 4, "left": 2, "ready": 2, "leased": 0, "success": 1,
        "failed": 1, "retried": 1, "dead": 1, "max_attempts": 10,
        "failed_by_reason": {"max_attempts": 0, "undeliverable": 0, "nacked": 1}}
    again = (await api.client.post("/queues/default/lease", json={"n": 10})).json()
    assert sorted(m["payload"]["n"] for m in again) == [1, 3]


async def test_acking_an_id_that_is_not_leased_counts_nothing(api: Api) -> None:
    r = await api.client.post("/queues/default/ack", json={"ids": ["999999"]})
    assert r.status_code == 200 and r.json() == {"acked": 0}


@pytest.mark.parametrize("ids", [["1" * 30], ["²"], ["١"], ["1#"], ["#1"], ["1#1#1"], ["-1"],
                                 [" 1"], ["0x1"]])
async def test_ids_that_are_not_message_ids_count_nothing(api: Api, ids: list[str]) -> None:
    await api.client.post("/task/", json={"n": 1})
    await api.client.post("/queues/default/lease", json={"n": 1})
    for op in ("ack", "nack"):
        r = await api.client.post(f"/queues/default/{op}", json={"ids": ids})
        assert r.status_code == 200 and r.json() == {f"{op}ed": 0}


@pytest.mark.parametrize("name", ["a b", "{tag}", "x#1", "q" * 201])
async def test_an_invalid_queue_name_is_400_for_every_queue_operation(api: Api,
                                                                      name: str) -> None:
    for op, body in (("lease", {"n": 1}), ("ack", {"ids": ["1"]}), ("nack", {"ids": ["1"]})):
        r = await api.client.post(f"/queues/{quote(name, safe='')}/{op}", json=body)
        assert r.status_code == 400, (op, r.text)
        assert "queue name" in r.json()["detail"]


@pytest.mark.parametrize(("path", "body"), [
    ("lease", {"n": 0}), ("lease", {"n": -1}), ("lease", {"n": "many"}),
    ("lease", {"visibility_timeout": 0}), ("lease", {"visibility_timeout": 10**9}),
    ("ack", {}), ("ack", {"ids": []}), ("ack", {"ids": "1"}), ("nack", {"ids": [1.5, {}]}),
    ("nack", {"ids": ["1"], "dead": "maybe"}), ("lease", [1]),
])
async def test_invalid_queue_arguments_are_422_naming_the_field(api: Api, path: str,
                                                               body: Any) -> None:
    r = await api.client.post(f"/queues/default/{path}", json=body)
    assert r.status_code == 422
    assert r.json()["detail"].startswith("invalid request: body")


async def test_metrics_count_dispatched_tasks_per_outbound(api: Api) -> None:
    await api.client.post("/task/", json=[{"n": 1}, {"n": 2}])
    r = await api.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'crawlhub_tasks_dispatched_total{outbound="default"} 2.0' in r.text.splitlines()
    assert 'crawlhub_outbound_lag{outbound="default"} 2.0' in r.text.splitlines()


async def test_healthz_reports_ok_and_each_backend(api: Api) -> None:
    r = await api.client.get("/healthz")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["checks"] == {"state": "ok", "queues": "ok"}


async def test_an_unknown_route_is_404_json_and_a_wrong_method_405_json(api: Api) -> None:
    r = await api.client.get("/no/such/thing")
    assert r.status_code == 404 and r.json() == {"detail": "no such endpoint: GET /no/such/thing"}
    r = await api.client.get("/task/")
    assert r.status_code == 405 and "GET" in r.json()["detail"]


async def test_the_openapi_document_describes_the_endpoints(api: Api) -> None:
    r = await api.client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    for path in ("/task/", "/inbound/{name}/check_task/", "/outbound/", "/outbound/{prefix}",
                 "/queues/", "/queues/{name}/lease", "/healthz", "/metrics"):
        assert path in paths


@contextlib.asynccontextmanager
async def serving(api: Api) -> AsyncIterator[str]:
    """The same app on a real socket (uvicorn, 127.0.0.1, a free port)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(services=api.svc), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())

    def started() -> bool:
        assert not task.done(), "uvicorn did not start"
        return bool(server.started)

    await wait_for(started, "uvicorn to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_over_a_real_socket_tasks_route_and_a_chunked_oversized_body_is_413(
        make_api: MakeApi) -> None:
    api = await make_api(server={"max_body_bytes": 2000})

    async def chunks() -> AsyncIterator[bytes]:
        yield b'[{"url": "'
        for _ in range(50):
            yield b"x" * 100
        yield b'"}]'

    async with serving(api) as base, aiohttp.ClientSession() as session:
        async with session.post(f"{base}/task/", json=[{"url": "a"}, {"url": "b"}]) as resp:
            assert resp.status == 200
            assert (await resp.json())["accepted"] == 2
        async with session.post(f"{base}/task/", data=chunks(),
                                headers={"Content-Type": "application/json"}) as resp:
            assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
            assert resp.status == 413
            assert "max_body_bytes" in (await resp.json())["detail"]
        async with session.get(f"{base}/healthz") as resp:
            assert resp.status == 200
    assert await api.queued("default") == 2

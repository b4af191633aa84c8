"""Poison messages over HTTP: intake refuses JSON nested deeper than the one limit
(``MAX_DEPTH``), a lease batch holding a message that cannot be handed out delivers the
others and dead-letters it, and a queue's delivery limit ends in the dead letter with
the reason, visible in ``/queues/{name}/dead``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crawlhub.core.errors import ConfigError
from crawlhub.core.jsoncodec import MAX_DEPTH, TooDeepError
from crawlhub.queues.common import BaseQueue
from tests.helpers import wait_for

from .conftest import Api, MakeApi


def task_of_depth(depth: int) -> dict[str, Any]:
    """A task nested exactly ``depth`` levels deep (a flat object is depth 1)."""
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = {"a": value}
    return {"url": "http://example.com/", "deep": value}


def deep_text(depth: int) -> str:
    """``task_of_depth(depth)`` as JSON text, written out (no encoder recursion)."""
    inner = '{"a":' * (depth - 1) + '"leaf"' + "}" * (depth - 1)
    return '{"url":"http://example.com/","deep":' + inner + "}"


async def post_raw(api: Api, path: str, body: Any) -> Any:
    text = body if isinstance(body, str) else json.dumps(body)
    return await api.client.post(path, content=text, headers={"content-type": "application/json"})


def assert_names_the_limit(r: Any) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert f"more than {MAX_DEPTH} levels deep" in body["detail"]
    assert body["max_depth"] == MAX_DEPTH


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 989])
async def test_a_task_nested_past_the_limit_is_refused_at_task_intake(
        make_api: MakeApi, depth: int) -> None:
    api = await make_api()

    single = await post_raw(api, "/task/", deep_text(depth))
    batch = await post_raw(api, "/task/", f'[{{"url":"http://a/"}},{deep_text(depth)}]')

    assert_names_the_limit(single)
    assert_names_the_limit(batch)
    # the item when the body parses; past the parser's own depth, the body
    assert batch.json()["detail"].startswith(("item 1 ", "request body "))
    assert await api.queued("default") == 0


async def test_a_task_nested_past_the_limit_is_refused_by_an_http_inbound(
        make_api: MakeApi) -> None:
    api = await make_api()

    r = await post_raw(api, "/inbound/http/", f"[{deep_text(300)}]")

    assert_names_the_limit(r)
    assert await api.queued("default") == 0


async def test_check_task_refuses_a_task_nested_past_the_limit(make_api: MakeApi) -> None:
    api = await make_api()

    assert_names_the_limit(await post_raw(api, "/inbound/http/check_task/", deep_text(300)))
    ok = await post_raw(api, "/inbound/http/check_task/", task_of_depth(MAX_DEPTH))
    assert ok.status_code == 200, ok.text
    assert ok.json()["outbound"] == "default"


async def test_a_task_at_the_limit_goes_in_and_comes_back_out_over_http(
        make_api: MakeApi) -> None:
    api = await make_api(outbound=[{"name": "default", "init": {"key": "default"},
                                    "task_params_wrapped": True}])
    task = task_of_depth(MAX_DEPTH)

    assert (await post_raw(api, "/task/", task)).status_code == 200
    r = await api.client.post("/queues/default/lease", json={"n": 10})

    assert r.status_code == 200, r.text
    (m,) = r.json()
    assert m["payload"]["task_params"]["deep"] == task["deep"]


async def test_a_lease_batch_with_an_undeliverable_message_delivers_the_healthy_ones(
        make_api: MakeApi) -> None:
    api = await make_api()
    await api.client.post("/task/", json=[{"n": 1}, {"n": 2}])
    queue = api.svc.queues.queue("default")
    assert isinstance(queue, BaseQueue)
    # Straight into the backend, past every intake check: what an older version or
    # another producer may have left there.
    (bad,) = await queue._push([(deep_text(300), 5)])
    await api.client.post("/task/", json={"n": 3})

    r = await api.client.post("/queues/default/lease", json={"n": 10})

    assert r.status_code == 200, r.text
    assert [m["payload"]["n"] for m in r.json()] == [1, 2, 3]
    dead = (await api.client.get("/queues/default/dead")).json()
    assert [d["id"] for d in dead] == [str(bad)]
    assert dead[0]["reason"].startswith("undeliverable: payload is nested more than")
    stats = {s["name"]: s for s in (await api.client.get("/queues/")).json()}["default"]
    assert (stats["leased"], stats["dead"], stats["ready"]) == (3, 1, 0)
    assert stats["failed_by_reason"]["undeliverable"] == 1
    # Nothing left that a later lease could choke on.
    assert (await api.client.post("/queues/default/lease", json={"n": 10})).json() == []


async def test_a_task_nacked_back_max_attempts_times_is_dead_lettered_with_the_reason(
        make_api: MakeApi) -> None:
    api = await make_api(outbound=[{"name": "default",
                                    "init": {"key": "default", "max_attempts": 2}}])
    await api.client.post("/task/", json={"n": 1})

    for _ in range(2):
        (m,) = (await api.client.post("/queues/default/lease", json={"n": 10})).json()
        r = await api.client.post("/queues/default/nack",
                                  json={"ids": [m["receipt"]], "reason": "captcha page"})
        assert r.json() == {"nacked": 1}

    assert (await api.client.post("/queues/default/lease", json={"n": 10})).json() == []
    (dead,) = (await api.client.get("/queues/default/dead")).json()
    assert dead["attempts"] == 2
    assert dead["reason"] == "delivered 2 times without ack; last nack: captcha page"
    stats = {s["name"]: s for s in (await api.client.get("/queues/")).json()}["default"]
    assert (stats["max_attempts"], stats["dead"], stats["left"]) == (2, 1, 0)
    assert stats["failed_by_reason"] == {"max_attempts": 1, "undeliverable": 0, "nacked": 0}


async def test_a_worker_can_say_why_it_dead_letters_a_message(make_api: MakeApi) -> None:
    api = await make_api()
    await api.client.post("/task/", json={"n": 1})
    (m,) = (await api.client.post("/queues/default/lease", json={})).json()

    await api.client.post("/queues/default/nack",
                          json={"ids": [m["id"]], "dead": True, "reason": "gone (410)"})

    (dead,) = (await api.client.get("/queues/default/dead", params={"n": 5})).json()
    assert (dead["payload"]["n"], dead["reason"]) == (1, "gone (410)")


async def test_dead_letters_of_an_invalid_queue_name_are_a_400(make_api: MakeApi) -> None:
    api = await make_api()

    r = await api.client.get("/queues/a b/dead")

    assert r.status_code == 400
    assert "queue name" in r.json()["detail"]


@pytest.mark.parametrize("bad", [0, -3, "ten", True])
async def test_a_bad_max_attempts_is_a_config_error_naming_the_key(
        make_api: MakeApi, bad: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        await make_api(outbound=[{"name": "q", "init": {"key": "q", "max_attempts": bad}}])

    assert caught.value.key == "init.max_attempts"
    assert "outbound" in str(caught.value.entry)


async def test_check_config_reports_a_bad_max_attempts_too(make_config: Any) -> None:
    from crawlhub.hub.plan import compile_config

    config = make_config(outbound=[{"name": "q", "init": {"key": "q", "max_attempts": 0}}])

    with pytest.raises(ConfigError, match="max_attempts must be a whole number >= 1"):
        compile_config(config)


async def test_max_attempts_on_a_redis_list_outbound_is_a_config_error(make_config: Any,
                                                                      redis_url: str) -> None:
    from crawlhub.hub.plan import compile_config

    config = make_config(outbound=[{"name": "l", "class": "redis_list", "init": {
        "url": redis_url, "key": "l", "max_attempts": 3}}])

    with pytest.raises(ConfigError, match="applies to 'queue' outbounds only") as caught:
        compile_config(config)
    assert caught.value.key == "init.max_attempts"


# --- the hub itself, for intakes other than HTTP ------------------------------------------
async def test_hub_submit_and_check_task_refuse_a_task_nested_past_the_limit(
        make_api: MakeApi) -> None:
    api = await make_api()
    deep = json.loads(deep_text(MAX_DEPTH + 1))

    with pytest.raises(TooDeepError, match=f"more than {MAX_DEPTH} levels deep"):
        await api.svc.hub.submit([{"n": 1}, deep])
    with pytest.raises(TooDeepError, match=f"more than {MAX_DEPTH} levels deep"):
        await api.svc.hub.check_task("http", deep)

    assert await api.queued("default") == 0


async def test_a_redis_inbound_sets_aside_a_deep_message_and_feeds_the_rest(
        make_api: MakeApi, redis_url: str, unique_name: str) -> None:
    import redis.asyncio as aioredis

    key = f"{unique_name}:in"
    api = await make_api(inbound=[{"name": "feed", "class": "redis", "init": {
        "url": redis_url, "key": key, "type": "list", "block": 0.1}}])
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.rpush(key, '{"n": 1}', deep_text(300), '{"n": 3}')
        await api.svc.start()
        await wait_for(lambda: client.llen(f"{key}:dead:feed"))
        await wait_for(lambda: _at_least(api.queued("default"), 2))

        assert sorted(p["n"] for p in await api.payloads("default")) == [1, 3]
        (dead,) = await client.lrange(f"{key}:dead:feed", 0, -1)
        assert dead.decode() == deep_text(300)
    finally:
        await client.delete(key, f"{key}:processing:feed", f"{key}:dead:feed")
        await client.aclose()


async def _at_least(count: Any, n: int) -> bool:
    return bool(await count >= n)

"""``GET /outbound/`` and ``/outbound/{prefix}``: config with secrets masked, queue length,
and Left / Total / Success / Failed / Retried counters that follow submits and results."""

from __future__ import annotations

from typing import Any

from tests.helpers import wait_for

from .conftest import Api, MakeApi

OUTBOUNDS = [
    {"name": "crawl_a", "selector": ["site == 'a'"], "init": {"key": "q_a"},
     "retry_limits": 1},
    {"name": "crawl_b", "selector": ["site == 'b'"], "init": {"key": "q_b"}},
    {"name": "default", "init": {"key": "default"}},
]


async def row(api: Api, name: str) -> dict[str, Any]:
    r = await api.client.get(f"/outbound/{name}")
    assert r.status_code == 200
    [found] = [x for x in r.json() if x["name"] == name]
    return found


def counters(found: dict[str, Any]) -> dict[str, int]:
    return {k: found[k] for k in ("total", "left", "success", "failed", "retried")}


async def test_every_outbound_is_listed_in_config_order_with_zero_counters(
        make_api: MakeApi) -> None:
    api = await make_api(outbound=OUTBOUNDS)
    r = await api.client.get("/outbound/")
    assert r.status_code == 200
    rows = r.json()
    assert [x["name"] for x in rows] == ["crawl_a", "crawl_b", "default"]
    assert all(counters(x) == dict.fromkeys(counters(x), 0) for x in rows)
    assert rows[0]["config"]["selector"] == ["site == 'a'"]
    assert rows[0]["config"]["retry_limits"] == 1


async def test_a_prefix_selects_outbounds_whose_name_starts_with_it(make_api: MakeApi) -> None:
    api = await make_api(outbound=OUTBOUNDS)
    r = await api.client.get("/outbound/crawl_")
    assert [x["name"] for x in r.json()] == ["crawl_a", "crawl_b"]


async def test_an_unknown_prefix_is_404_json(make_api: MakeApi) -> None:
    api = await make_api(outbound=OUTBOUNDS)
    r = await api.client.get("/outbound/nothing_like_this")
    assert r.status_code == 404
    assert "nothing_like_this" in r.json()["detail"]


async def test_total_and_left_count_submitted_tasks(make_api: MakeApi) -> None:
    api = await make_api(outbound=OUTBOUNDS)
    await api.client.post("/task/", json=[{"site": "a"}, {"site": "a"}, {"site": "b"}])
    assert counters(await row(api, "crawl_a")) == {
        "total": 2, "left": 2, "success": 0, "failed": 0, "retried": 0}
    assert (await row(api, "crawl_a"))["queue_length"] == 2
    assert counters(await row(api, "crawl_b"))["total"] == 1


async def test_left_falls_when_a_worker_finishes_a_message(make_api: MakeApi) -> None:
    api = await make_api(outbound=OUTBOUNDS)
    await api.client.post("/task/", json=[{"site": "b"}, {"site": "b"}])
    leased = (await api.client.post("/queues/q_b/lease", json={"n": 1})).json()
    await api.client.post("/queues/q_b/ack", json={"ids": [leased[0]["id"]]})
    # The hub trusts a measured lag for a moment (hub.LAG_TTL), so ask until it re-reads.
    async def left_is_one() -> bool:
        left = counters(await row(api, "crawl_b"))["left"]
        assert left in (1, 2)
        return left == 1

    await wait_for(left_is_one, "'left' to fall to 1", every=0.05)


async def test_results_posted_to_the_inbound_move_success_retried_and_failed(
        make_api: MakeApi) -> None:
    api = await make_api(outbound=OUTBOUNDS, routing={"terminal_codes": [1000]})
    answer = (await api.client.post("/task/", json=[{"site": "a"}, {"site": "a"}])).json()
    first, second = (t["task_uuid"] for t in answer["tasks"])

    async def result(uuid: str, code: int) -> str:
        r = await api.client.post("/inbound/http/", json={"task_uuid": uuid,
                                                          "task_result": code})
        assert r.status_code == 200
        return str(r.json()["status"])

    assert await result(first, 1000) == "success"
    assert await result(second, 1500) == "retry"  # retry_limits 1: one retry
    assert await result(second, 1500) == "failed"
    assert counters(await row(api, "crawl_a")) == {
        "total": 3, "left": 3, "success": 1, "failed": 1, "retried": 1}


async def test_a_result_for_an_unknown_task_changes_no_counter(make_api: MakeApi) -> None:
    api = await make_api(outbound=OUTBOUNDS)
    r = await api.client.post("/inbound/http/", json={"task_uuid": "f" * 32,
                                                      "task_result": 1000})
    assert r.status_code == 200 and r.json()["status"] == "orphan"
    assert all(sum(counters(x).values()) == 0
               for x in (await api.client.get("/outbound/")).json())


async def test_a_password_in_an_outbound_url_is_masked(make_api: MakeApi,
                                                       unique_name: str) -> None:
    url = "redis://:secretpw@127.0.0.1:6379/0"
    api = await make_api(outbound=[
        {"name": "legacy", "class": "redis_list", "init": {"url": url, "key": unique_name}},
    ])
    for path in ("/outbound/", "/outbound/leg"):
        r = await api.client.get(path)
        assert r.status_code == 200
        assert "secretpw" not in r.text
        assert r.json()[0]["config"]["init"]["url"].startswith("redis://")

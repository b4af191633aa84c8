"""Backpressure over HTTP: an outbound at its ``max_lag`` makes ``POST /task/`` 503 with
Retry-After and writes nothing; a ``token_per_second`` scope defers what it cannot
dispatch now, and those tasks route when sent again."""

from __future__ import annotations

from typing import Any

from tests.helpers import FakeClock, wait_for

from .conftest import Api, MakeApi

LAGGED = [{"name": "lagged", "selector": ["kind == 'lag'"], "max_lag": 3,
           "init": {"key": "q_lag"}},
          {"name": "default", "init": {"key": "default"}}]


async def fill(api: Api, n: int) -> None:
    for i in range(n):
        r = await api.client.post("/task/", json={"kind": "lag", "n": i})
        assert r.status_code == 200


async def test_an_outbound_at_max_lag_answers_503_with_retry_after_and_writes_nothing(
        make_api: MakeApi) -> None:
    api = await make_api(outbound=LAGGED)
    await fill(api, 3)
    pending = await api.svc.state.pending()
    for body in ({"kind": "lag", "n": 3}, [{"kind": "lag"}, {"kind": "other"}]):
        r = await api.client.post("/task/", json=body)
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
        assert "max_lag" in r.json()["detail"]
    assert await api.queued("q_lag") == 3
    assert await api.queued("default") == 0  # the list's other task was not written either
    assert await api.svc.state.pending() == pending


async def test_other_outbounds_still_take_tasks_while_one_is_at_max_lag(
        make_api: MakeApi) -> None:
    api = await make_api(outbound=LAGGED)
    await fill(api, 3)
    r = await api.client.post("/task/", json={"kind": "other"})
    assert r.status_code == 200 and r.json()["outbound"] == "default"


async def test_intake_resumes_once_a_worker_finishes_a_task(make_api: MakeApi) -> None:
    api = await make_api(outbound=LAGGED)
    await fill(api, 3)
    [leased] = (await api.client.post("/queues/q_lag/lease", json={"n": 1})).json()
    assert (await api.client.post("/task/", json={"kind": "lag"})).status_code == 503
    await api.client.post("/queues/q_lag/ack", json={"ids": [leased["id"]]})
    # The hub trusts a measured lag briefly (hub.LAG_TTL); a client honouring
    # Retry-After gets in on its next try.
    async def admitted() -> Any:
        r = await api.client.post("/task/", json={"kind": "lag", "n": 9})
        assert r.status_code == 200 or await api.queued("q_lag") == 2
        return r if r.status_code == 200 else None

    r = await wait_for(admitted, "the hub to re-read the lag and admit the task", every=0.05)
    assert r.json()["outbound"] == "lagged"
    assert await api.queued("q_lag") == 3


RATED = [{"name": "slow", "token_per_second": 20, "init": {"key": "q_slow"}}]


async def test_tasks_over_the_token_rate_come_back_deferred_with_503(
        make_api: MakeApi, clock: FakeClock) -> None:
    api = await make_api(outbound=RATED)
    api.svc.state.clock = clock  # type: ignore[attr-defined]
    r = await api.client.post("/task/", json=[{"n": i} for i in range(30)])
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= 1
    body = r.json()
    statuses = [t["status"] for t in body["tasks"]]
    routed = statuses.count("routed")
    assert routed == 20  # the full bucket; no time passed to refill it
    assert statuses == ["routed"] * routed + ["deferred"] * (30 - routed)
    assert body["accepted"] == routed
    assert all("token scope 'slow'" in t["reason"] for t in body["tasks"][routed:])
    queued = await api.payloads("q_slow")
    assert sorted(m["n"] for m in queued) == list(range(routed))
    deferred_uuids = {t["task_uuid"] for t in body["tasks"][routed:]}
    assert deferred_uuids.isdisjoint(m["task_uuid"] for m in queued)
    assert await api.svc.state.pending() == routed


async def test_deferred_tasks_route_when_sent_again_later(make_api: MakeApi, clock: FakeClock
                                                          ) -> None:
    api = await make_api(outbound=RATED)
    api.svc.state.clock = clock  # type: ignore[attr-defined]
    waiting: list[dict[str, Any]] = [{"n": i} for i in range(30)]
    for answer in (503, 200):
        r = await api.client.post("/task/", json=waiting)
        results = r.json()["tasks"]
        waiting = [task for task, res in zip(waiting, results, strict=True)
                   if res["status"] == "deferred"]
        assert r.status_code == answer
        clock.advance(float(r.headers.get("retry-after", 0)))  # the client honours it
    assert waiting == []
    queued = await api.payloads("q_slow")
    assert sorted(m["n"] for m in queued) == list(range(30))


async def test_a_single_task_with_no_token_left_is_503_deferred(make_api: MakeApi) -> None:
    api = await make_api(outbound=[{"name": "slow", "token_per_second": 1,
                                    "init": {"key": "q_slow"}}])
    assert (await api.client.post("/task/", json={"n": 1})).status_code == 200
    r = await api.client.post("/task/", json={"n": 2})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["status"] == "deferred"
    assert await api.queued("q_slow") == 1

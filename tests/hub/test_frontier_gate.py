"""A frontier in front of the hub: tasks with a URL are admitted once per segment before
routing; duplicates are counted, not routed (SQLite and real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from crawlhub.app.asgi import create_app
from crawlhub.hub.dispatch import LAG_TTL

Opener = Callable[[Any], Any]


async def test_outbound_frontier_routes_a_url_once_per_segment(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(
        frontier={"web": {"segment": "1d", "expected_items": 1000}},
        outbound=[{"name": "pages", "selector": ["url"], "frontier": "web"},
                  {"name": "other"}]))
    first = await svc.hub.submit([
        {"url": "https://Example.com:443/a?b=2&a=1#top"},
        {"url": "https://example.com/a?a=1&b=2&utm_source=x"},  # same canonical key
        {"url": "https://example.com/b"},
    ])
    assert [r.status for r in first] == ["routed", "duplicate", "routed"]
    assert "frontier 'web'" in (first[1].reason or "")
    again = await svc.hub.submit([{"url": "https://example.com/b"}])
    assert again[0].status == "duplicate"
    assert await svc.queues.queue("pages").length() == 2
    [stats] = await svc.frontiers["web"].stats()
    assert stats["admitted"] == 2 and stats["duplicates"] == 2


async def test_task_without_url_passes_the_frontier_ungated(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(
        frontier={"web": {}},
        outbound=[{"name": "any", "frontier": "web"}]))
    results = await svc.hub.submit([{"company": "c"}, {"company": "c"}])
    assert [r.status for r in results] == ["routed", "routed"]


async def test_inbound_frontier_gates_messages_pushed_through_it(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(
        frontier={"links": {"url_field": "link"}},
        inbound=[{"name": "discovered", "class": "http", "frontier": "links"}],
        outbound=[{"name": "o"}]))
    outcomes = await svc.hub.receive("discovered", [{"link": "http://x/1"},
                                                    {"link": "http://x/1"}])
    assert [o["status"] for o in outcomes] == ["routed", "duplicate"]
    assert await svc.queues.queue("o").length() == 1


async def test_backpressure_refusal_does_not_admit_the_url(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    from crawlhub.core.errors import BackpressureError

    svc = await open_services(make_config(
        frontier={"web": {}},
        outbound=[{"name": "o", "frontier": "web", "max_lag": 1}]))
    await svc.hub.submit([{"url": "http://x/1"}])
    with pytest.raises(BackpressureError):
        await svc.hub.submit([{"url": "http://x/2"}])
    await svc.queues.queue("o").ack([m.id for m in await svc.queues.queue("o").lease(5, 60)])
    await asyncio.sleep(LAG_TTL * 1.5)  # the hub trusts a measured lag this long
    # Refused earlier, so not a duplicate now.
    assert [r.status for r in await svc.hub.submit([{"url": "http://x/2"}])] == ["routed"]


async def test_frontier_stats_over_the_api(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    import httpx2 as httpx

    svc = await open_services(make_config(
        frontier={"web": {}}, outbound=[{"name": "o", "frontier": "web"}]))
    app = create_app(services=svc)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://hub") as client:
        body = [{"url": "http://x/1"}, {"url": "http://x/1"}, {"url": "http://x/2"}]
        answer = (await client.post("/task/", json=body)).json()
        assert [t["status"] for t in answer["tasks"]] == ["routed", "duplicate", "routed"]
        frontiers = (await client.get("/frontier/")).json()
    text = repr(frontiers)
    assert "web" in text and "'admitted': 2" in text and "'duplicates': 1" in text


async def test_an_unusable_url_is_rejected_alone(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(
        frontier={"web": {}}, outbound=[{"name": "o", "frontier": "web"}]))
    results = await svc.hub.submit([{"url": "http://x/1"}, {"url": "http://[::1"},
                                    {"url": "http://x/2"}])
    assert [r.status for r in results] == ["routed", "rejected", "routed"]
    assert "frontier 'web'" in (results[1].reason or "")
    assert await svc.queues.queue("o").length() == 2
    # counted as every refusal is (it was not, before)
    assert svc.hub.metrics.registry.get_sample_value("crawlhub_tasks_rejected_total") == 1

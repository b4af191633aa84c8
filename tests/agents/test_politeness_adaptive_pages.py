"""The adaptive figures of each domain, as the agents page and ``/metrics`` show them:
written by a gate on ``storage.agents`` (SQLite, real Redis), read by the server."""

from __future__ import annotations

from crawlhub.agents.politeness import DomainRules, open_gate
from tests.api import conftest as api_fixtures
from tests.api.conftest import Api, MakeApi
from tests.helpers import FakeClock

# the API suite's fixtures: services on SQLite and on real Redis, an app, a client
backend = api_fixtures.backend
make_config = api_fixtures.make_config
make_api = api_fixtures.make_api

RULES = DomainRules(concurrency=8, adaptive=True, lease=60)


async def feed(api: Api, clock: FakeClock) -> None:
    storage = api.svc.config.storage
    gate = open_gate(storage.agents_url, prefix=storage.redis_prefix, rules=RULES,
                     clock=clock, sleep=clock.sleep)
    try:
        for status in (200, 200, 200, 503):
            slot = await gate.acquire('shop"example.test')  # a quote: labels are escaped
            clock.advance(0.05)
            await gate.release(slot, status, latency=0.05)
    finally:
        await gate.close()


async def test_metrics_show_each_domains_limit_delay_latency_and_answers(
        make_api: MakeApi, clock: FakeClock) -> None:
    api = await make_api()
    await feed(api, clock)
    lines = (await api.client.get("/metrics")).text.splitlines()
    d = 'domain="shop\\"example.test"'
    assert f"crawlhub_domain_concurrency_limit{{{d}}} 2.0" in lines  # 1 +1 +1 +1, halved
    assert f'crawlhub_domain_answers_total{{{d},outcome="ok"}} 3' in lines
    assert f'crawlhub_domain_answers_total{{{d},outcome="overload"}} 1' in lines
    assert any(line.startswith(f"crawlhub_domain_delay_seconds{{{d}}} 0.") for line in lines)
    assert f"crawlhub_domain_latency_seconds{{{d}}} 0.05" in lines


async def test_the_agents_page_lists_each_domains_figures(make_api: MakeApi,
                                                          clock: FakeClock) -> None:
    api = await make_api()
    empty = await api.client.get("/ui/agents/live")
    assert "no domain under adaptive politeness yet" in empty.text
    await feed(api, clock)
    page = (await api.client.get("/ui/agents/live")).text
    assert "shop&#34;example.test" in page or "shop&quot;example.test" in page
    assert "2.0" in page and "50 ms" in page

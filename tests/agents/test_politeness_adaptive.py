"""Adaptive politeness: each domain's concurrency and delay follow its server's latency
and overloads, shared by every agent on one backend (a SQLite file, real Redis), and
survive a restart. The store is driven by a fake clock; the crawl tests run against a
real local server that slows down under load and answers 503 past a threshold."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from crawlhub.agents.politeness import (
    DomainGate,
    DomainRules,
    open_gate,
    open_gate_store,
    retry_after_seconds,
)
from crawlhub.agents.politeness.adaptive import Feedback, feedback_of, step
from crawlhub.app.crawl import Crawl, CrawlOptions
from tests.agents.servers import _Server, page_html
from tests.agents.stores import Backend, backend_fixture  # noqa: F401 - the fixture
from tests.helpers import FakeClock

ADAPTIVE = DomainRules(concurrency=32, start=2, lease=60, adaptive=True, max_delay=5.0)
D = "example.test"


@pytest.fixture
async def gate(backend: Backend, clock: FakeClock) -> AsyncIterator[DomainGate]:
    g = open_gate(backend.url, prefix=backend.prefix, rules=ADAPTIVE, clock=clock,
                  sleep=clock.sleep)
    yield g
    await g.close()


async def answer(gate: DomainGate, clock: FakeClock, n: int, *, latency: float,
                 status: int = 200, retry_after: float | None = None) -> None:
    """``n`` requests to D, one after another, each taking ``latency`` seconds."""
    for _ in range(n):
        slot = await gate.acquire(D)
        clock.advance(latency)
        await gate.release(slot, status, retry_after, latency=latency)


async def limit_of(gate: DomainGate) -> float:
    [fig] = await gate.figures()
    return fig.limit


async def test_the_limit_climbs_to_the_target_while_the_server_keeps_up(
        gate: DomainGate, clock: FakeClock) -> None:
    await answer(gate, clock, 1, latency=0.05)
    assert await limit_of(gate) == 3  # slow start: one more per answer
    await answer(gate, clock, 100, latency=0.05)
    [fig] = await gate.figures()
    assert fig.limit == 32  # never past the target
    assert fig.delay == 0 and fig.errors == 0 and fig.ok == 101
    assert fig.latency == pytest.approx(0.05)
    # and the gate grants that many at once
    slots = await gate.acquire_many(D, 40)
    assert len(slots) == 32


async def test_an_overload_halves_the_limit_and_raises_the_delay_then_both_recover(
        gate: DomainGate, clock: FakeClock) -> None:
    await answer(gate, clock, 30, latency=0.05)
    before = await limit_of(gate)
    await answer(gate, clock, 1, latency=0.05, status=503)
    [fig] = await gate.figures()
    assert fig.limit == before / 2
    assert fig.delay > 0 and fig.errors == 1
    assert fig.backoff == 0  # no Retry-After: no whole-domain pause, a cut instead
    # the delay paces starts: one slot per acquire now
    assert len(await gate.acquire_many(D, 10)) == 1
    clock.advance(fig.delay)
    await answer(gate, clock, 200, latency=0.05)
    [after] = await gate.figures()
    assert after.delay == 0
    assert after.limit > fig.limit  # additive increase after the cut
    assert after.error_rate < 0.01


async def test_one_burst_of_overloads_in_one_round_trip_cuts_once(
        gate: DomainGate, clock: FakeClock) -> None:
    await answer(gate, clock, 30, latency=0.5)
    before = await limit_of(gate)
    slots = await gate.acquire_many(D, 8)
    for slot in slots:  # eight 503s answered within the same round trip
        await gate.release(slot, 503, latency=0.5)
    [fig] = await gate.figures()
    assert fig.limit == before / 2 and fig.errors == 8


async def test_a_server_that_queues_cuts_the_limit_without_any_error(
        gate: DomainGate, clock: FakeClock) -> None:
    await answer(gate, clock, 10, latency=0.01)
    top = await limit_of(gate)
    await answer(gate, clock, 10, latency=0.2)  # twenty times slower: queueing
    [fig] = await gate.figures()
    assert fig.limit < top and fig.errors == 0


async def test_retry_after_still_pauses_the_domain_and_is_capped(
        gate: DomainGate, clock: FakeClock) -> None:
    await answer(gate, clock, 3, latency=0.05)
    await answer(gate, clock, 1, latency=0.05, status=429,
                 retry_after=retry_after_seconds("99999999999999999999", clock()))
    [fig] = await gate.figures()
    assert fig.backoff == pytest.approx(ADAPTIVE.backoff_cap, abs=1e-3)  # the cap, no more
    grant = await gate.store.acquire(D, 1, clock(), ADAPTIVE, "probe")
    assert grant.ids == [] and grant.reason == "pace"


@pytest.mark.parametrize("value", ["soon", "-5", "1e309", "NaN", "٣", "\x00\r\n12",
                                   "Fri, 31 Dec 99999 23:59:59 GMT", "9" * 400, ""])
def test_a_garbage_retry_after_is_no_pause(value: str) -> None:
    assert retry_after_seconds(value, 1_700_000_000.0) in (None, math.inf)
    gate = DomainGate.__new__(DomainGate)
    gate.rules, gate.domains = ADAPTIVE, {}
    pause = gate.backoff_for(D, 200, retry_after_seconds(value, 1_700_000_000.0))
    assert pause is None or pause == ADAPTIVE.backoff_cap


def test_absurd_latencies_are_no_sample() -> None:
    for bad in (float("nan"), -1.0, float("inf"), 1e12):
        assert feedback_of(200, bad).latency is None
    s = step(None, feedback_of(200, float("nan")), 1.0, target=8, start=1, tolerance=2.0,
             floor=0.0, max_delay=1.0)
    assert s.latency == 0 and s.limit == 2


async def test_the_figures_survive_a_restart_and_a_reset(backend: Backend,
                                                        clock: FakeClock) -> None:
    g = open_gate(backend.url, prefix=backend.prefix, rules=ADAPTIVE, clock=clock,
                  sleep=clock.sleep)
    await answer(g, clock, 20, latency=0.05)
    await answer(g, clock, 1, latency=0.05, status=503)
    [before] = await g.figures()
    await g.reset()  # a crawl's start frees slots and pace, not what it learned
    await g.close()
    again = open_gate(backend.url, prefix=backend.prefix, rules=ADAPTIVE, clock=clock,
                      sleep=clock.sleep)
    try:
        [after] = await again.figures()
        assert (after.limit, after.ok, after.errors) == (before.limit, before.ok, before.errors)
        assert after.delay == pytest.approx(before.delay)
        # the next acquire is bounded by the learned limit, not by the start
        clock.advance(after.delay)
        assert len(await again.acquire_many(D, 40)) == 1  # a delay is set: one per start
    finally:
        await again.close()


async def test_both_backends_step_alike(tmp_path: Path, redis_url: str, unique_name: str,
                                       clock: FakeClock) -> None:
    history = [(0.02, 200)] * 12 + [(0.3, 200)] * 3 + [(0.3, 503)] * 2 + [(0.02, 200)] * 20
    figures = []
    for url, prefix in ((f"sqlite:///{tmp_path}/g.db", ""), (redis_url, f"test:{unique_name}:")):
        c = FakeClock()
        g = open_gate(url, prefix=prefix, rules=ADAPTIVE, clock=c, sleep=c.sleep)
        try:
            for latency, status in history:
                await answer(g, c, 1, latency=latency, status=status)
            figures.append((await g.figures())[0])
        finally:
            await g.store.reset()
            await g.close()
    lite, red = figures
    for name in ("limit", "delay", "latency", "base", "error_rate", "ok", "errors"):
        assert getattr(lite, name) == pytest.approx(getattr(red, name), rel=1e-9), name


def test_feedback_counts_timeouts_and_overload_statuses_only() -> None:
    assert feedback_of(None, 30.0, failed=True) == Feedback(30.0, True)
    assert feedback_of(503, 0.1).overloaded and feedback_of(429, 0.1).overloaded
    assert not feedback_of(404, 0.1).overloaded and not feedback_of(500, 0.1).overloaded


class LoadSite(_Server):
    """A site that slows down under load: each page takes ``base * (1 + in_flight / k)``
    seconds, and past ``threshold`` requests in flight it answers 503 at once."""

    def __init__(self, pages: int, *, base: float = 0.01, k: float = 4.0,
                 threshold: int = 16) -> None:
        super().__init__()
        self.pages, self.base, self.k, self.threshold = pages, base, k, threshold
        self.in_flight = 0
        self.peak = 0
        self.overloaded = 0
        self.app.router.add_get("/page/{n}", self.page)

    async def page(self, request: web.Request) -> web.Response:
        if self.in_flight >= self.threshold:
            self.overloaded += 1
            return web.Response(status=503, text="overloaded")
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.base * (1 + self.in_flight / self.k))  # the server's work
            n = int(request.match_info["n"])
            return web.Response(text=page_html(n, self.pages), content_type="text/html")
        finally:
            self.in_flight -= 1


async def crawl(site: LoadSite, tmp_path: Path, **kw: Any) -> Any:
    opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=tmp_path / "items.jsonl",
                        data_dir=tmp_path / "data", follow=True, concurrency=64,
                        robots=False, **kw)
    return await asyncio.wait_for(Crawl(opts).run(), 120)  # bounds a hung test only


async def test_a_server_that_slows_under_load_is_crawled_without_errors_when_adaptive(
        tmp_path: Path) -> None:
    async with LoadSite(pages=150) as site:
        progress = await crawl(site, tmp_path, adaptive=True)
    assert progress.pages == 150 and progress.errors == 0
    assert site.overloaded == 0 and site.peak < site.threshold
    store = open_gate_store(f"sqlite:///{tmp_path / 'data' / 'politeness.db'}")
    try:
        [fig] = await store.figures(0.0)
    finally:
        await store.close()
    assert 1 <= fig.limit < site.threshold and fig.errors == 0 and fig.ok >= 150


async def test_the_same_server_fails_a_fixed_concurrency_of_64(tmp_path: Path) -> None:
    async with LoadSite(pages=150) as site:
        progress = await crawl(site, tmp_path)
    assert site.overloaded > 0
    assert progress.errors > 0

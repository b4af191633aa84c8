"""Several hub processes on one state backend (the same Redis, or the same SQLite file)
see one hub: the same dispatch rate and orphan counts, and lost tasks swept once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from crawlhub.services import Services
from tests.helpers import FakeClock

Opener = Callable[[Any], Any]


async def test_two_hubs_report_the_same_dispatch_rate_and_orphan_counts(
        make_config: Callable[..., Any], open_services: Opener, clock: FakeClock) -> None:
    cfg = make_config(outbound=[{"name": "o"}, {"name": "p", "selector": ["False"]}])
    first: Services = await open_services(cfg)
    second: Services = await open_services(cfg)
    await first.hub.submit([{"n": i} for i in range(20)])
    clock.set(time.time())  # the dispatches were counted by the wall clock
    first.hub.clock = second.hub.clock = clock
    await second.hub.receive("http", [
        {"task_uuid": "f" * 32, "outbound": "o", "task_result": 1000},
        {"task_uuid": "e" * 32, "task_result": 1000}])
    for hub in (first.hub, second.hub):
        rows = {row["name"]: row for row in await hub.outbound_stats()}
        assert rows["o"]["rate"] == 2.0 and rows["p"]["rate"] == 0.0
        assert rows["o"]["orphan"] == 1 and rows["p"]["orphan"] == 0
        assert await hub.orphans() == 2
    # Ten seconds on, the window holds none of those dispatches.
    clock.advance(10)
    assert await first.hub.rate("o") == 0.0


async def test_two_hubs_sweeping_at_once_handle_each_lost_task_once(
        make_config: Callable[..., Any], open_services: Opener, clock: FakeClock) -> None:
    cfg = make_config(outbound=[{"name": "o", "result_timeout": "30s", "retry_limits": 1}])
    first: Services = await open_services(cfg)
    second: Services = await open_services(cfg)
    answers = await first.hub.submit([{"n": i} for i in range(40)])
    queue = first.queues.queue("o")
    await queue.ack([m.id for m in await queue.lease(100, 600)])
    clock.set(time.time() + 31)  # every deadline has passed, by both hubs' clocks
    first.hub.clock = second.hub.clock = clock
    swept = await asyncio.gather(first.hub.sweep_lost(), second.hub.sweep_lost(),
                                 first.hub.sweep_lost(), second.hub.sweep_lost())
    assert sum(swept) == 40
    [row] = await second.hub.outbound_stats()
    assert (row["timeout"], row["retried"], row["total"]) == (40, 40, 80)
    retried = await queue.lease(100, 600)
    assert sorted(m.payload["task_uuid"] for m in retried) == sorted(
        str(a.task_uuid) for a in answers)
    assert {m.payload["routed_count"] for m in retried} == {2}

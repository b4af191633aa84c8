"""A result whose follow-up cannot be pushed (the target outbound's Redis is down) is
settled all the same; its next dispatch waits leased in the ledger and a sweep pushes it
once the outbound is back. Nothing is lost, and the result sent again is stale."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from crawlhub.services import Services
from tests.helpers import FakeClock
from tests.servers import throwaway_valkey


async def test_a_follow_up_whose_push_fails_is_pushed_by_a_sweep_when_the_outbound_is_back(
        make_config: Callable[..., Any], open_services: Callable[[Any], Any],
        clock: FakeClock) -> None:
    with throwaway_valkey() as server:
        svc: Services = await open_services(make_config(outbound=[
            {"name": "main", "retry_limits": 0, "failback": "backup"},
            {"name": "backup", "class": "redis_list", "selector": ["False"],
             "init": {"url": server.url, "key": "spider"}}]))
        await svc.hub.submit([{"n": 1}])
        queue = svc.queues.queue("main")
        [message] = await queue.lease(1, 600)
        await queue.ack([message.id])
        task = message.payload
        result = {"task_uuid": task["task_uuid"], "routed_count": task["routed_count"],
                  "task_result": 500}

        clock.set(time.time())
        svc.hub.clock = clock
        server.stop()
        with pytest.raises(Exception, match="(?i)connect"):
            await svc.hub.receive("http", [result])
        entry = await svc.state.get(task["task_uuid"])
        assert entry is not None and entry.outbound == "backup"
        assert (await svc.hub.receive("http", [result]))[0]["status"] == "stale"
        clock.advance(1)
        assert await svc.hub.sweep_lost() == 0  # still leased to the first try

        server.start()
        clock.advance(svc.hub.lease)
        assert await svc.hub.sweep_lost() == 1
        client = aioredis.Redis.from_url(server.url)
        try:
            [pushed] = [json.loads(m) for m in await client.lrange("spider", 0, -1)]
        finally:
            await client.aclose()
        assert pushed["task_uuid"] == task["task_uuid"] and pushed["outbound"] == "backup"
        assert await svc.hub.sweep_lost() == 0
        rows = {row["name"]: row for row in await svc.hub.outbound_stats()}
        assert rows["main"]["failback"] == 1 and rows["backup"]["total"] == 1

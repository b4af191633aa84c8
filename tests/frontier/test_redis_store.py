"""What only the Redis store does: the shared BITFIELD bloom filter and cross-process
wake-ups."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from crawlhub.frontier import Seed
from crawlhub.keys import frontier_segment_key

from .conftest import MakeFrontier


@pytest.fixture
def backend() -> str:
    return "redis"


async def test_the_filter_is_plain_redis_strings_sized_up_front(
    make_frontier: MakeFrontier, redis_url: str, unique_name: str
) -> None:
    f = await make_frontier(expected_items=1_000_000, fp_rate=1e-3)
    await f.admit([Seed("http://a.com/1")])
    layer = frontier_segment_key(f"{unique_name}:", "f", f.current_segment(), "bloom:1")
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.type(layer) == b"string"
        size = await client.strlen(layer)
        assert size * 8 >= 14_000_000  # the whole first layer, not grown bit by bit
        assert await client.bitcount(layer) > 0
        used = await f.store.filter_bytes()
        assert used / 1_000_000 <= 2.0  # bytes per expected key, allocator included
    finally:
        await client.aclose()


async def test_the_filter_grows_in_layers_shared_by_every_process(
    make_frontier: MakeFrontier, redis_url: str, unique_name: str
) -> None:
    a = await make_frontier(expected_items=50, fp_rate=0.01)
    b = await make_frontier(expected_items=50, fp_rate=0.01)
    urls = [Seed(f"http://a.com/{i}") for i in range(400)]
    await a.admit(urls)
    meta = frontier_segment_key(f"{unique_name}:", "f", a.current_segment(), "bloom")
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert int(await client.hget(meta, "layers") or 0) >= 3
    finally:
        await client.aclose()
    assert await b.admit([Seed(f"http://a.com/{i}") for i in range(400)]) == [False] * 400


async def test_an_admission_in_another_process_wakes_a_waiting_frontier(
    make_frontier: MakeFrontier,
) -> None:
    waiting = await make_frontier(clock_=time.time)
    other = await make_frontier(clock_=time.time)
    waiter = asyncio.create_task(waiting.wait_ready(30))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await other.admit([Seed("http://a.com/1")])
    assert await asyncio.wait_for(waiter, 10) is True

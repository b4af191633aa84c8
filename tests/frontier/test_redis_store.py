"""What only the Redis store does: the shared BITFIELD bloom filter and cross-process
wake-ups."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from crawlhub.core.keys import frontier_segment_key
from crawlhub.frontier import Seed
from crawlhub.frontier.redis import RedisSeedStore

from .conftest import MakeFrontier


@pytest.fixture
def backend() -> str:
    return "redis"


async def test_the_filter_is_plain_redis_strings_sized_up_front(
    make_frontier: MakeFrontier, redis_url: str, unique_name: str
) -> None:
    f = await make_frontier(expected_items=1_000_000, fp_rate=1e-3)
    await f.admit([Seed("http://a.com/1")])
    assert isinstance(f.store, RedisSeedStore)
    await f.store.settle()  # the bits are set just after admit returns
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
    assert isinstance(a.store, RedisSeedStore)
    await a.store.settle()
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


async def test_a_repeat_this_process_has_seen_costs_no_script_and_still_counts(
    make_frontier: MakeFrontier, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = await make_frontier()
    assert await f.admit([Seed("http://a.com/1")]) == [True]
    store = f.store
    assert isinstance(store, RedisSeedStore)

    def no_script(*args: object) -> None:
        raise AssertionError("the admit script ran for a key this process has seen")

    monkeypatch.setitem(store.scripts, "admit", no_script)
    assert await f.admit([Seed("http://a.com/1#again")]) == [False]
    (row,) = await f.stats()
    assert (row["admitted"], row["duplicates"]) == (1, 1)


async def test_a_key_whose_filter_bits_were_never_set_is_admitted_once(
    make_frontier: MakeFrontier, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await make_frontier()
    b = await make_frontier()  # another process: its own (empty) cache
    assert isinstance(a.store, RedisSeedStore)

    async def dies_before_setting_bits(*args: object) -> None:
        return None

    monkeypatch.setattr(a.store, "_owe", dies_before_setting_bits)
    assert await a.admit([Seed("http://a.com/1")]) == [True]
    assert await b.admit([Seed("http://a.com/1")]) == [False]  # the seed record decides
    (row,) = await b.stats()
    assert (row["admitted"], row["duplicates"]) == (1, 1)


async def test_a_key_found_by_another_process_before_its_bits_are_set_counts_once(
    make_frontier: MakeFrontier, monkeypatch: pytest.MonkeyPatch, redis_url: str,
    unique_name: str,
) -> None:
    a = await make_frontier(expected_items=1, fp_rate=0.01)
    b = await make_frontier(expected_items=1, fp_rate=0.01)  # another process
    assert isinstance(a.store, RedisSeedStore)
    held: list[tuple[object, ...]] = []
    owe = a.store._owe

    async def late(*args: object) -> None:  # a's bits go out after b's
        held.append(args)

    monkeypatch.setattr(a.store, "_owe", late)
    assert await a.admit([Seed("http://a.com/1")]) == [True]
    assert await b.admit([Seed("http://a.com/1")]) == [False]  # found: b sets the bits
    assert isinstance(b.store, RedisSeedStore)
    await b.store.settle()
    await owe(*held[0])  # type: ignore[arg-type]
    await a.store.settle()
    meta = frontier_segment_key(f"{unique_name}:", "f", a.current_segment(), "bloom")
    client = aioredis.Redis.from_url(redis_url)
    try:  # one key, counted once: the first layer (capacity 1) is not outgrown
        assert await client.hmget(meta, ["layers", "count1"]) == [b"1", b"1"]
    finally:
        await client.aclose()

"""Redis stream sink specifics on a real Redis: trimming, the dedupe index, all-or-nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from crawlhub.core.errors import SinkError
from crawlhub.core.keys import sink_stream_index
from crawlhub.sinks.base import Sink
from crawlhub.sinks.config import build_sink


@pytest.fixture
async def client(redis_url: str, unique_name: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    stream = f"test:{unique_name}:stream"
    await c.delete(stream, sink_stream_index(f"test:{unique_name}:", stream))
    await c.aclose()


async def open_sink(redis_url: str, unique_name: str, **spec: object) -> Sink:
    sink = build_sink(
        {
            "type": "redis_stream",
            "url": redis_url,
            "stream": f"test:{unique_name}:stream",
            "prefix": f"test:{unique_name}:",
            **spec,
        }
    )
    await sink.open()
    return sink


async def test_entries_carry_key_content_hash_and_data(
    redis_url: str, unique_name: str, client: aioredis.Redis
) -> None:
    sink = await open_sink(redis_url, unique_name)
    try:
        await sink.write_batch([{"id": 7, "v": "x"}])
    finally:
        await sink.close()
    [(_, fields)] = await client.xrange(f"test:{unique_name}:stream")
    assert fields[b"key"] == b"7"
    assert len(fields[b"content_hash"]) == 32
    assert json.loads(fields[b"data"]) == {"id": 7, "v": "x"}


async def test_maxlen_trims_the_stream_but_redelivery_is_still_recognised(
    redis_url: str, unique_name: str, client: aioredis.Redis
) -> None:
    sink = await open_sink(redis_url, unique_name, maxlen=3, approximate=False)
    try:
        await sink.write_batch([{"id": i} for i in range(10)])
        again = await sink.write_batch([{"id": 0}])
    finally:
        await sink.close()
    assert await client.xlen(f"test:{unique_name}:stream") == 3
    assert again.skipped == 1


async def test_a_key_of_the_wrong_type_fails_the_batch_before_anything_is_added(
    redis_url: str, unique_name: str, client: aioredis.Redis
) -> None:
    stream = f"test:{unique_name}:stream"
    await client.set(stream, "not a stream")
    sink = await open_sink(redis_url, unique_name)
    try:
        with pytest.raises(SinkError, match="not a stream"):
            await sink.write_batch([{"id": 1}, {"id": 2}])
    finally:
        await sink.close()
    assert await client.exists(sink_stream_index(f"test:{unique_name}:", stream)) == 0


def test_index_key_shares_the_stream_hash_slot() -> None:
    assert sink_stream_index("ch:", "items") == "ch:sink:{items}:index:items"
    assert sink_stream_index("ch:", "out:{shop}:items").startswith("ch:sink:{shop}:")

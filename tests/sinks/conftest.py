"""Fixtures of the sink suites: every backend on its real server, and a way to read back.

A ``Backend`` builds sinks through ``build_sink`` and reads what the store holds, one
dict per stored line / row / stream entry / message, so the conformance suite can check
the same behaviour everywhere.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition

from crawlhub.core.keys import sink_stream_index
from crawlhub.sinks.base import Sink
from crawlhub.sinks.config import build_sink

BACKENDS = ["jsonl", "sqlite", "postgres", "redis_stream", "kafka"]
#: Backends that recognise a redelivered record themselves (Kafka leaves it to consumers).
DEDUPING = ["jsonl", "sqlite", "postgres", "redis_stream"]


@dataclass
class Backend:
    kind: str
    spec: dict[str, Any]
    read: Callable[[], Awaitable[list[dict[str, Any]]]]
    opened: list[Sink] = field(default_factory=list)

    async def open(self, **overrides: Any) -> Sink:
        sink = build_sink({**self.spec, **overrides})
        await sink.open()
        self.opened.append(sink)
        return sink


async def read_kafka(bootstrap: str, topic: str) -> list[tuple[bytes, dict[str, Any], dict[str, bytes]]]:
    """Every message of ``topic`` as (key, value, headers), read without a consumer group."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.topics()  # fresh metadata: the topic may be brand new
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out = []
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for messages in (await consumer.getmany(timeout_ms=1000)).values():
                out.extend((m.key, json.loads(m.value), dict(m.headers)) for m in messages)
        return out
    finally:
        await consumer.stop()


async def drop_table(url: str, table: str) -> None:
    """Drop a table this test created (never anything else)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP TABLE IF EXISTS "{table}"')
    finally:
        await conn.close()


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> AsyncIterator[Backend]:
    async for b in make_backend(request.param, request, tmp_path, unique_name):
        yield b


@pytest.fixture(params=DEDUPING)
async def deduping_backend(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> AsyncIterator[Backend]:
    """The backends that recognise a redelivered record themselves."""
    async for b in make_backend(request.param, request, tmp_path, unique_name):
        yield b


async def make_backend(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> AsyncIterator[Backend]:
    cleanup: Callable[[], Awaitable[None]] | None = None
    if kind == "jsonl":
        path = tmp_path / "out.jsonl"

        async def read() -> list[dict[str, Any]]:
            return [json.loads(line) for line in path.read_text().splitlines()]

        spec: dict[str, Any] = {"type": "jsonl", "path": str(path)}
    elif kind == "sqlite":
        db_path = tmp_path / "out.db"

        async def read() -> list[dict[str, Any]]:
            import sqlite3

            with sqlite3.connect(db_path) as db:
                return [json.loads(d) for (d,) in db.execute("SELECT data FROM items ORDER BY rowid")]

        spec = {"type": "sqlite", "path": str(db_path)}
    elif kind == "postgres":
        url = request.getfixturevalue("postgres_url")

        async def read() -> list[dict[str, Any]]:
            conn = await asyncpg.connect(url)
            try:
                rows = await conn.fetch(
                    f'SELECT data, source_endpoint, fetched_at, source_file FROM "{unique_name}" '
                    "ORDER BY created_at, id"
                )
            finally:
                await conn.close()
            out = []
            for row in rows:
                record = json.loads(row["data"])
                for name in ("source_endpoint", "source_file"):
                    if row[name] is not None:
                        record[name] = row[name]
                if row["fetched_at"] is not None:
                    record["fetched_at"] = row["fetched_at"].isoformat()
                out.append(record)
            return out

        spec = {"type": "postgres", "url": url, "table": unique_name}

        async def cleanup() -> None:
            await drop_table(url, unique_name)

    elif kind == "redis_stream":
        url = request.getfixturevalue("redis_url")
        stream, prefix = f"test:{unique_name}:stream", f"test:{unique_name}:"

        async def read() -> list[dict[str, Any]]:
            client = aioredis.Redis.from_url(url)
            try:
                entries = await client.xrange(stream)
            finally:
                await client.aclose()
            return [json.loads(fields[b"data"]) for _, fields in entries]

        spec = {"type": "redis_stream", "url": url, "stream": stream, "prefix": prefix}

        async def cleanup() -> None:
            client = aioredis.Redis.from_url(url)
            try:
                await client.delete(stream, sink_stream_index(prefix, stream))
            finally:
                await client.aclose()

    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")

        async def read() -> list[dict[str, Any]]:
            return [value for _, value, _ in await read_kafka(bootstrap, unique_name)]

        # Tansu 0.6 refuses aiokafka's InitProducerId v0, i.e. idempotent producers.
        spec = {
            "type": "kafka",
            "bootstrap_servers": bootstrap,
            "topic": unique_name,
            "idempotence": False,
        }
    b = Backend(kind, spec, read)
    yield b
    for sink in b.opened:
        await sink.close()
    if cleanup is not None:
        await cleanup()


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection for checking what PostgreSQL sinks wrote."""
    conn = await asyncpg.connect(postgres_url)
    yield conn
    await conn.close()


@pytest.fixture
async def tables(postgres_url: str, unique_name: str) -> AsyncIterator[Callable[[str], str]]:
    """``tables("a")`` -> a unique table name, dropped after the test."""
    made: list[str] = []

    def name(suffix: str) -> str:
        made.append(f"{unique_name}_{suffix}")
        return made[-1]

    yield name
    for table in made:
        await drop_table(postgres_url, table)

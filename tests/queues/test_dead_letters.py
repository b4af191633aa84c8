"""Nothing wedges a queue (both backends): a message delivered ``max_attempts`` times
without an ack goes to the dead letter with its reason, and a payload that cannot be
handed out is dead-lettered by the lease that meets it while the rest are delivered."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crawlhub.core.errors import QueueError
from crawlhub.core.jsoncodec import MAX_STORED_DEPTH
from crawlhub.queues import QueueBackend, ReliableQueue
from crawlhub.queues.common import DEFAULT_MAX_ATTEMPTS, BaseQueue
from tests.helpers import FakeClock

from .conftest import Store


def nested(depth: int) -> dict[str, Any]:
    """A JSON object ``depth`` levels deep."""
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    result: dict[str, Any] = value
    return result


async def deliver_without_ack(queue: ReliableQueue, clock: FakeClock, times: int) -> list[int]:
    """Lease the queue ``times`` times, letting each lease expire; the attempts seen."""
    seen = []
    for _ in range(times):
        got = await queue.lease(10, visibility_timeout=5)
        seen += [m.attempts for m in got]
        clock.advance(5)
    return seen


# --- the delivery limit --------------------------------------------------------------------
async def test_message_leased_max_attempts_times_without_ack_goes_to_the_dead_letter(
    store: Store, clock: FakeClock, unique_name: str
) -> None:
    queue = store.open(clock=clock).queue(unique_name, max_attempts=3)
    await queue.push({"n": 1})

    assert await deliver_without_ack(queue, clock, 3) == [1, 2, 3]

    assert await queue.lease(10) == []
    (dead,) = await queue.dead_letters()
    assert (dead.payload, dead.attempts, dead.reason) == (
        {"n": 1}, 3, "delivered 3 times without ack")
    stats = await queue.stats()
    assert (stats.dead, stats.failed, stats.retried, stats.left, stats.max_attempts) == (
        1, 1, 2, 0, 3)
    assert stats.failed_by_reason == {"max_attempts": 1, "undeliverable": 0, "nacked": 0}


async def test_default_delivery_limit_is_ten(timed_queue: ReliableQueue, clock: FakeClock
                                             ) -> None:
    await timed_queue.push({"n": 1})

    attempts = await deliver_without_ack(timed_queue, clock, DEFAULT_MAX_ATTEMPTS + 2)

    assert attempts == list(range(1, DEFAULT_MAX_ATTEMPTS + 1)) == list(range(1, 11))
    (dead,) = await timed_queue.dead_letters()
    assert dead.reason == "delivered 10 times without ack"
    assert (await timed_queue.stats()).max_attempts == 10


async def test_requeue_expired_dead_letters_a_spent_lease_at_once(
    store: Store, clock: FakeClock, unique_name: str
) -> None:
    queue = store.open(clock=clock).queue(unique_name, max_attempts=1)
    await queue.push_many([({"n": 1}, 0), ({"n": 2}, 0)])
    await queue.lease(1, visibility_timeout=5)
    clock.advance(5)

    assert await queue.requeue_expired() == 1

    stats = await queue.stats()
    assert (stats.dead, stats.ready, stats.leased) == (1, 1, 0)


async def test_spent_leases_die_in_the_order_their_deadlines_passed(
    store: Store, clock: FakeClock, unique_name: str
) -> None:
    queue = store.open(clock=clock).queue(unique_name, max_attempts=1)
    await queue.push_many([({"n": 1}, 0), ({"n": 2}, 0)])
    await queue.lease(1, visibility_timeout=10)  # n=1, deadline +10
    await queue.lease(1, visibility_timeout=5)  # n=2, deadline +5
    clock.advance(10)

    await queue.requeue_expired()

    assert [d.payload["n"] for d in await queue.dead_letters()] == [2, 1]


async def test_nack_back_to_ready_after_the_last_delivery_dead_letters_with_the_nack_reason(
    store: Store, unique_name: str
) -> None:
    queue = store.open().queue(unique_name, max_attempts=2)
    await queue.push({"n": 1})
    (first,) = await queue.lease()
    assert await queue.nack([first.receipt], reason="site answered 500") == 1
    (second,) = await queue.lease()

    assert await queue.nack([second.receipt], reason="site answered 500") == 1

    assert await queue.lease() == []
    (dead,) = await queue.dead_letters()
    assert dead.reason == "delivered 2 times without ack; last nack: site answered 500"
    stats = await queue.stats()
    assert (stats.retried, stats.failed, stats.dead) == (1, 1, 1)


async def test_a_configured_limit_holds_for_every_process_on_the_storage(
    store: Store, clock: FakeClock, unique_name: str
) -> None:
    hub = store.open(clock=clock).queue(unique_name, max_attempts=2)
    await hub.push({"n": 1})
    worker = store.open(clock=clock).queue(unique_name)  # opened with no limit of its own

    assert await deliver_without_ack(worker, clock, 3) == [1, 2]

    (dead,) = await worker.dead_letters()
    assert dead.reason == "delivered 2 times without ack"
    assert (await worker.stats()).max_attempts == 2


async def test_opening_a_queue_again_with_a_limit_changes_it(backend: QueueBackend,
                                                             unique_name: str) -> None:
    assert backend.queue(unique_name).max_attempts is None
    assert backend.queue(unique_name, max_attempts=4).max_attempts == 4
    assert backend.queue(unique_name).max_attempts == 4
    assert (await backend.queue(unique_name).stats()).max_attempts == 4


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_invalid_max_attempts_is_refused(backend: QueueBackend, unique_name: str,
                                         bad: Any) -> None:
    with pytest.raises(QueueError, match="max_attempts must be an int >= 1"):
        backend.queue(unique_name, max_attempts=bad)


async def test_nack_to_the_dead_letter_keeps_the_workers_reason(queue: ReliableQueue) -> None:
    await queue.push_many([({"n": 1}, 0), ({"n": 2}, 0)])
    a, b = await queue.lease(2)

    await queue.nack([a.id], dead=True, reason="page removed (404)")
    await queue.nack([b.id], dead=True)

    assert [(d.payload["n"], d.reason) for d in await queue.dead_letters()] == [
        (1, "page removed (404)"), (2, "nacked to the dead letter")]
    assert (await queue.stats()).failed_by_reason == {
        "max_attempts": 0, "undeliverable": 0, "nacked": 2}


# --- payloads a lease cannot hand out ------------------------------------------------------
POISON = {
    "too deep": json.dumps(nested(MAX_STORED_DEPTH + 50)),
    "not JSON": "{not json",
    "not an object": "[1, 2]",
    "lone surrogate": '{"a": "\\ud800"}',
}


async def put_raw(queue: ReliableQueue, text: str) -> str:
    """Store ``text`` as a payload straight into the backend, past every intake check."""
    assert isinstance(queue, BaseQueue)
    (num,) = await queue._push([(text, 0)])
    return str(num)


@pytest.mark.parametrize("kind", list(POISON))
async def test_a_lease_dead_letters_an_undeliverable_payload_and_delivers_the_rest(
    queue: ReliableQueue, kind: str
) -> None:
    await queue.push({"n": 1})
    bad = await put_raw(queue, POISON[kind])
    await queue.push({"n": 3})

    got = await queue.lease(10)

    assert [m.payload for m in got] == [{"n": 1}, {"n": 3}]
    (dead,) = await queue.dead_letters()
    assert dead.id == bad
    assert dead.reason is not None and dead.reason.startswith("undeliverable: payload")
    assert await queue.ack([m.receipt for m in got]) == 2
    assert await queue.lease(10) == []
    stats = await queue.stats()
    assert (stats.success, stats.dead, stats.left) == (2, 1, 0)
    assert stats.failed_by_reason == {"max_attempts": 0, "undeliverable": 1, "nacked": 0}


async def test_a_dead_letter_that_cannot_be_read_is_shown_as_its_text(
        queue: ReliableQueue) -> None:
    await put_raw(queue, "{not json")
    assert await queue.lease(10) == []

    (dead,) = await queue.dead_letters()

    assert dead.payload == {"unreadable_payload": "{not json"}


async def test_a_too_deep_payload_is_named_as_such(queue: ReliableQueue) -> None:
    await put_raw(queue, POISON["too deep"])
    await queue.lease(10)

    (dead,) = await queue.dead_letters()

    assert dead.reason == (
        f"undeliverable: payload is nested more than {MAX_STORED_DEPTH} levels deep")
    assert json.dumps(dead.payload)  # a peek never fails either


async def test_push_refuses_a_payload_too_deep_to_lease(queue: ReliableQueue) -> None:
    with pytest.raises(QueueError, match=f"nested more than {MAX_STORED_DEPTH} levels deep"):
        await queue.push(nested(MAX_STORED_DEPTH + 1))
    await queue.push(nested(MAX_STORED_DEPTH))

    (m,) = await queue.lease()
    assert m.payload == nested(MAX_STORED_DEPTH)

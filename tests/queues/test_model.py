"""Random operation sequences on each backend agree with a plain-Python model of the queue.

Hypothesis drives push/lease/ack/nack/extend/expiry on a fake clock and compares every
answer and every counter with :class:`Model`. The queue's delivery limit is small
(:data:`MAX_ATTEMPTS`), so runs reach it: dead letters by expiry and by nack are modelled.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from crawlhub.queues import QueueBackend, ReliableQueue
from crawlhub.queues.common import spent_reason
from tests.helpers import FakeClock

from .conftest import BACKENDS, Store, delete_prefix, make_store

READY, LEASED, DEAD = "ready", "leased", "dead"
MAX_ATTEMPTS = 2


@dataclass
class Entry:
    payload: dict[str, Any]
    priority: int
    state: str = READY
    attempts: int = 0
    until: float = 0.0
    reason: str | None = None


@dataclass
class Model:
    """The queue contract in a few lines: what every backend must answer."""

    entries: dict[int, Entry] = field(default_factory=dict)
    dead_order: list[int] = field(default_factory=list)
    failed_by: dict[str, int] = field(
        default_factory=lambda: {"max_attempts": 0, "undeliverable": 0, "nacked": 0})
    total: int = 0
    success: int = 0
    failed: int = 0
    retried: int = 0

    def requeue(self, now: float) -> int:
        # Both backends end expired leases by deadline, then id.
        expired = sorted(
            (i for i, e in self.entries.items() if e.state == LEASED and e.until <= now),
            key=lambda i: (self.entries[i].until, i),
        )
        for i in expired:
            e = self.entries[i]
            if e.attempts >= MAX_ATTEMPTS:
                self.kill(i, spent_reason(e.attempts), "max_attempts")
            else:
                e.state = READY
                self.retried += 1
        return len(expired)

    def kill(self, i: int, reason: str, kind: str) -> None:
        e = self.entries[i]
        e.state, e.reason = DEAD, reason
        self.dead_order.append(i)
        self.failed += 1
        self.failed_by[kind] += 1

    def lease(self, n: int, until: float) -> list[int]:
        ready = sorted(
            (i for i, e in self.entries.items() if e.state == READY),
            key=lambda i: (-self.entries[i].priority, i),
        )[:n]
        for i in ready:
            e = self.entries[i]
            e.state, e.attempts, e.until = LEASED, e.attempts + 1, until
        return ready

    def holds(self, ref: str) -> int | None:
        num, sep, attempt = ref.partition("#")
        e = self.entries.get(int(num))
        if e is None or e.state != LEASED or (sep and int(attempt) != e.attempts):
            return None
        return int(num)

    def count(self, state: str) -> int:
        return sum(1 for e in self.entries.values() if e.state == state)


class QueueMachine(RuleBasedStateMachine):
    kind: str
    url: str
    prefix: str

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        store = Store(self.kind, self.url, self.prefix)
        self.backend: QueueBackend = store.open(clock=self.clock)
        self.queue: ReliableQueue = self.backend.queue("m" + uuid.uuid4().hex[:10],
                                                       max_attempts=MAX_ATTEMPTS)
        self.model = Model()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.queue.purge())
        self.run(self.backend.close())
        self.loop.close()

    def refs(self, data: st.DataObject) -> list[str]:
        """Ids and receipts of known messages (some stale), plus an unknown id."""
        known = sorted(self.model.entries) or [1]
        ref = st.builds(
            lambda i, a: str(i) if a is None else f"{i}#{a}",
            st.sampled_from(known),
            st.none() | st.integers(1, 4),
        )
        return data.draw(st.lists(ref | st.just("987654"), max_size=4))

    @rule(priorities=st.lists(st.integers(-2, 2), max_size=5))
    def push_many(self, priorities: list[int]) -> None:
        items = [({"k": uuid.uuid4().hex[:6]}, p) for p in priorities]
        ids = self.run(self.queue.push_many(items))
        assert len(ids) == len(items)
        for id_, (payload, priority) in zip(ids, items, strict=True):
            assert int(id_) not in self.model.entries
            self.model.entries[int(id_)] = Entry(payload, priority)
        self.model.total += len(items)

    @rule(n=st.integers(1, 4), timeout=st.integers(1, 5))
    def lease(self, n: int, timeout: int) -> None:
        got = self.run(self.queue.lease(n, visibility_timeout=timeout))
        self.model.requeue(self.clock())
        expected = self.model.lease(n, self.clock() + timeout)
        assert [int(m.id) for m in got] == expected
        for m in got:
            e = self.model.entries[int(m.id)]
            assert (m.payload, m.priority, m.attempts) == (e.payload, e.priority, e.attempts)
            assert m.lease_until == e.until

    @precondition(lambda self: self.model.entries)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        refs = self.refs(data)
        done = self.run(self.queue.ack(refs))
        expected = 0
        for ref in refs:
            if (num := self.model.holds(ref)) is not None:
                del self.model.entries[num]
                expected += 1
        self.model.success += expected
        assert done == expected

    @precondition(lambda self: self.model.entries)
    @rule(data=st.data(), dead=st.booleans(), reason=st.sampled_from([None, "bad page"]))
    def nack(self, data: st.DataObject, dead: bool, reason: str | None) -> None:
        refs = self.refs(data)
        done = self.run(self.queue.nack(refs, dead=dead, reason=reason))
        expected = 0
        for ref in refs:
            if (num := self.model.holds(ref)) is not None:
                e = self.model.entries[num]
                if dead:
                    self.model.kill(num, reason or "nacked to the dead letter", "nacked")
                elif e.attempts >= MAX_ATTEMPTS:
                    last = f"; last nack: {reason}" if reason else ""
                    self.model.kill(num, spent_reason(e.attempts) + last, "max_attempts")
                else:
                    e.state = READY
                    self.model.retried += 1
                expected += 1
        assert done == expected

    @precondition(lambda self: self.model.entries)
    @rule(data=st.data(), timeout=st.integers(1, 5))
    def extend(self, data: st.DataObject, timeout: int) -> None:
        refs = self.refs(data)
        done = self.run(self.queue.extend(refs, visibility_timeout=timeout))
        held = {num for ref in refs if (num := self.model.holds(ref)) is not None}
        for num in held:
            self.model.entries[num].until = self.clock() + timeout
        assert done == len(held)

    @rule(seconds=st.sampled_from([0.5, 1, 2, 5]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(n=st.integers(1, 4))
    def worker_dies_holding_leases(self, n: int) -> None:
        """Lease, then the leases run out unacked: how messages reach their delivery limit."""
        self.lease(n, 1)
        self.advance_clock(1)

    @rule()
    def requeue_expired(self) -> None:
        assert self.run(self.queue.requeue_expired()) == self.model.requeue(self.clock())

    @rule()
    def stats_and_length(self) -> None:
        stats = self.run(self.queue.stats())
        self.model.requeue(self.clock())
        m = self.model
        ready, leased, dead = m.count(READY), m.count(LEASED), m.count(DEAD)
        assert stats.as_dict() == {
            "name": self.queue.name,
            "total": m.total,
            "left": ready + leased,
            "ready": ready,
            "leased": leased,
            "success": m.success,
            "failed": m.failed,
            "retried": m.retried,
            "dead": dead,
            "max_attempts": MAX_ATTEMPTS,
            "failed_by_reason": m.failed_by,
        }
        assert self.run(self.queue.length()) == ready + leased

    @invariant()
    def dead_letters_match(self) -> None:
        dead = self.run(self.queue.dead_letters(1000))
        assert [int(d.id) for d in dead] == self.model.dead_order
        for d in dead:
            e = self.model.entries[int(d.id)]
            assert (d.attempts, d.reason, d.payload) == (e.attempts, e.reason, e.payload)


@pytest.mark.parametrize("kind", BACKENDS)
def test_backend_agrees_with_the_model(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> None:
    store = make_store(kind, request, tmp_path, unique_name)
    machine: type[QueueMachine] = type(
        f"QueueMachine_{kind}",
        (QueueMachine,),
        {"kind": kind, "url": store.url, "prefix": store.prefix},
    )
    case = machine.TestCase
    case.settings = settings(
        max_examples=40,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    try:
        case().runTest()
    finally:
        if kind == "redis":
            asyncio.run(delete_prefix(store.url, store.prefix))

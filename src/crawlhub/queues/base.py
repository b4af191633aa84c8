"""The reliable priority queue protocol every backend implements.

Callers: the hub's ``queue`` outbound pushes; workers (agents, CLI ``lease``/``ack``)
lease, ack and nack. A leased message is invisible until its visibility timeout ends,
then returns to ready by itself: a worker killed while holding leases loses nothing.

Nothing wedges a queue: a message delivered ``max_attempts`` times without an ack (its
lease expired or it was nacked back each time) goes to the dead letter instead of back to
ready, and a message whose payload cannot be handed out (not JSON, nested deeper than
:data:`crawlhub.core.jsoncodec.MAX_STORED_DEPTH`) is dead-lettered by the lease that finds it
while the rest of the batch is delivered. Every dead letter carries its ``reason``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(slots=True)
class Message:
    """One leased message.

    ``id`` is the queue's own id (use it to ack/nack); ``attempts`` counts the leases
    this message has had, including the current one. ``receipt`` names this very lease:
    ack/nack/extend given a receipt act only while this lease is the current one, so a
    worker whose lease expired and was handed to another worker cannot finish it.
    ``reason`` is set on dead letters only: why the message died, e.g. ``"delivered 10
    times without ack"``.
    """

    id: str
    payload: dict[str, Any]
    priority: int
    attempts: int
    lease_until: float
    reason: str | None = None

    @property
    def receipt(self) -> str:
        """``"<id>#<attempts>"``: accepted wherever an id is, but only for this lease."""
        return f"{self.id}#{self.attempts}"


@dataclass(slots=True)
class QueueStats:
    """Counters of one queue; names are what the API and ``crawlhub queues`` show.

    total: messages ever pushed; left: ready + leased (not yet acked or dead);
    ready: waiting to be leased; leased: currently leased; success: acked;
    failed: moved to the dead letter (nacked there, over ``max_attempts``, or a payload
    that cannot be delivered); retried: nacked back to ready or expired leases returned;
    dead: messages currently in the dead letter; max_attempts: the delivery limit in force;
    failed_by_reason: ``failed`` split by why - ``max_attempts`` (delivered that many times
    without an ack), ``undeliverable`` (a payload a lease could not hand out), ``nacked``
    (a worker nacked it to the dead letter).
    """

    name: str
    total: int = 0
    left: int = 0
    ready: int = 0
    leased: int = 0
    success: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    max_attempts: int = 0
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "total": self.total,
            "left": self.left,
            "ready": self.ready,
            "leased": self.leased,
            "success": self.success,
            "failed": self.failed,
            "retried": self.retried,
            "dead": self.dead,
            "max_attempts": self.max_attempts,
            "failed_by_reason": dict(self.failed_by_reason),
        }


@runtime_checkable
class ReliableQueue(Protocol):
    """One named queue. Higher ``priority`` is leased first; FIFO within a priority.

    ``max_attempts`` is the delivery limit this queue object was opened with (``None``:
    the limit stored with the queue, else :data:`~crawlhub.queues.common.DEFAULT_MAX_ATTEMPTS`).
    Every push stores a configured limit with the queue, so every process leasing from it
    (HTTP, CLI, agents) applies the outbound's limit.
    """

    name: str
    max_attempts: int | None

    async def push(self, payload: dict[str, Any], priority: int = 0) -> str:
        """Store one message; returns its id."""
        ...

    async def push_many(self, items: Sequence[tuple[dict[str, Any], int]]) -> list[str]:
        """Store many ``(payload, priority)`` messages atomically; returns their ids."""
        ...

    async def lease(self, n: int = 1, visibility_timeout: float = 60.0) -> list[Message]:
        """Lease up to ``n`` ready messages for ``visibility_timeout`` seconds.

        A message whose payload cannot be delivered is dead-lettered with the reason and
        left out; the others are returned. Never fails because of one message.
        """
        ...

    async def ack(self, ids: Sequence[str]) -> int:
        """Finish leased messages; returns how many were leased and are now done.

        ``ids`` are message ids or receipts (see :attr:`Message.receipt`); an id that is
        unknown, not leased, or a receipt of an older lease is skipped and not counted.
        The same holds for ``nack`` and ``extend``.
        """
        ...

    async def nack(self, ids: Sequence[str], *, dead: bool = False,
                   reason: str | None = None) -> int:
        """Return leased messages to ready (``dead=False``) or to the dead letter, with
        ``reason`` if given. A message nacked back after its ``max_attempts``-th delivery
        goes to the dead letter instead (reason ``"delivered N times without ack"``)."""
        ...

    async def extend(self, ids: Sequence[str], visibility_timeout: float) -> int:
        """Push the lease deadline of leased messages ``visibility_timeout`` from now."""
        ...

    async def requeue_expired(self) -> int:
        """End expired leases now (also done lazily by ``lease`` and ``stats``): back to
        ready, or to the dead letter after ``max_attempts`` deliveries. Returns how many."""
        ...

    async def requeue_leased(self) -> int:
        """End every lease now, expired or not, as ``requeue_expired`` ends expired ones:
        for a caller that knows the holders are gone (a crawl restarted on its locked data
        dir). Returns how many."""
        ...

    async def length(self) -> int:
        """Messages not yet finished (ready + leased): the outbound's lag."""
        ...

    async def stats(self) -> QueueStats: ...

    async def dead_letters(self, n: int = 100) -> list[Message]:
        """Peek at up to ``n`` dead messages (oldest first), each with its ``reason``.

        A payload that cannot be read is shown as ``{"unreadable_payload": "<text>"}``.
        """
        ...

    async def purge(self) -> int:
        """Drop every message and counter of this queue (tests, admin)."""
        ...


@runtime_checkable
class QueueBackend(Protocol):
    """Opens named queues on one storage (a SQLite file or a Redis server)."""

    url: str

    def queue(self, name: str, *, max_attempts: int | None = None) -> ReliableQueue:
        """The queue ``name`` (one object per name); ``max_attempts`` sets its delivery
        limit (``None`` keeps the one it has)."""
        ...

    async def push_multi(
        self, groups: Mapping[str, Sequence[tuple[dict[str, Any], int]]]
    ) -> dict[str, list[str]]:
        """Push ``(payload, priority)`` items onto several queues in one backend call
        (one SQLite transaction, one Redis round trip); returns the ids per queue."""
        ...

    async def names(self) -> list[str]:
        """Names of the queues this backend holds."""
        ...

    async def close(self) -> None: ...

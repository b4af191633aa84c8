"""What every queue backend shares: argument checks, JSON encoding, message and stats assembly.

:class:`BaseQueue` implements the public :class:`ReliableQueue` methods once; a backend
only stores and moves already-validated rows in its ``_underscored`` methods.
"""

from __future__ import annotations

import json
import logging
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from crawlhub.core import jsoncodec
from crawlhub.core.errors import CrawlhubError, QueueError
from crawlhub.core.names import check_name
from crawlhub.queues.base import Message, QueueStats

log = logging.getLogger("crawlhub.queues")

#: Priorities are 32-bit signed ints: both backends store them exactly.
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1

#: Deliveries without an ack before a message goes to the dead letter, unless the queue's
#: outbound sets ``init.max_attempts``.
DEFAULT_MAX_ATTEMPTS = 10
#: Dead-letter reasons are cut to this many characters.
REASON_MAX = 500
#: Why messages die, as counted in :attr:`QueueStats.failed_by_reason`.
DEAD_KINDS = ("max_attempts", "undeliverable", "nacked")
#: The reason prefix of a payload a lease (or an answer) could not hand out.
UNDELIVERABLE = "undeliverable: "

_NAME = re.compile(r"\A[^\s{}#]{1,200}\Z")
#: An id or receipt: ASCII digits that fit a 64-bit integer (``"17"``, ``"17#2"``).
_REF = re.compile(r"([0-9]{1,18})(?:#([0-9]{1,18}))?")


@dataclass(frozen=True, slots=True)
class Ref:
    """A message id as given to ack/nack/extend; ``attempt`` is set when it was a receipt."""

    num: int
    attempt: int | None = None


@dataclass(slots=True)
class QueueCounters:
    """Raw counters a backend reads in one atomic step; :func:`build_stats` names them."""

    total: int = 0
    success: int = 0
    failed: int = 0
    retried: int = 0
    ready: int = 0
    leased: int = 0
    dead: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    failed_max_attempts: int = 0
    failed_undeliverable: int = 0
    failed_nacked: int = 0


@dataclass(slots=True)
class Row:
    """A stored message as a backend reads it; :class:`BaseQueue` decodes the payload."""

    num: int
    data: str | bytes
    priority: int
    attempts: int
    until: float = 0.0
    reason: str | None = None


class UndeliverableError(ValueError):
    """A stored payload that cannot be handed out; the message says why."""


class QueueNameError(QueueError):
    """A queue name no backend takes (the API answers 400)."""


def _bad_queue_name(name: Any) -> QueueNameError:
    return QueueNameError(
        f"queue name {name!r} is invalid: use 1-200 characters without whitespace, "
        "'{', '}' or '#' (e.g. the outbound name)"
    )


def check_queue_name(name: str) -> str:
    return check_name(name, _NAME, _bad_queue_name)


def check_count(n: int, what: str, place: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise QueueError(f"{place}: {what} must be an int >= 1, got {n!r}")
    return n


def check_timeout(seconds: float, place: str) -> float:
    ok = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not ok or not math.isfinite(seconds) or seconds <= 0:
        raise QueueError(
            f"{place}: visibility_timeout must be a finite number of seconds > 0, got {seconds!r}"
        )
    return float(seconds)


def check_max_attempts(value: Any, place: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise QueueError(f"{place}: max_attempts must be an int >= 1 (deliveries without an"
                         f" ack before the dead letter), got {value!r}")
    return value


def spent_reason(attempts: int) -> str:
    """The dead-letter reason of a message over its delivery limit."""
    return f"delivered {attempts} times without ack"


def dead_kind(reason: str | None) -> str:
    """The kind of a nack to the dead letter: ``undeliverable`` or ``nacked``."""
    return "undeliverable" if (reason or "").startswith(UNDELIVERABLE) else "nacked"


def clip_reason(reason: str) -> str:
    reason = str(reason)
    return reason if len(reason) <= REASON_MAX else reason[: REASON_MAX - 3] + "..."


def _brackets(data: str | bytes) -> int:
    """Opening brackets in JSON text: an upper bound of its depth, found at C speed."""
    if isinstance(data, bytes):
        return data.count(b"{") + data.count(b"[")
    return data.count("{") + data.count("[")


def encode_item(item: tuple[dict[str, Any], int], index: int, queue: str) -> tuple[str, int]:
    """``(payload, priority)`` -> ``(payload JSON, priority)``, or a QueueError naming the item."""
    try:
        payload, priority = item
    except (TypeError, ValueError):
        raise QueueError(
            f"queue {queue!r}: item {index} must be a (payload dict, priority int) pair, "
            f"got {item!r:.200}"
        ) from None
    if not isinstance(payload, dict):
        raise QueueError(
            f"queue {queue!r}: item {index} payload must be a dict, got {type(payload).__name__}"
        )
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        raise QueueError(
            f"queue {queue!r}: item {index} priority must be an int in "
            f"[{PRIORITY_MIN}, {PRIORITY_MAX}], got {priority!r}"
        )
    try:
        data = jsoncodec.dumps_strict(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise QueueError(
            f"queue {queue!r}: item {index} payload is not JSON-serialisable ({exc}); "
            "convert it to plain dicts, lists, strings and numbers first"
        ) from None
    limit = jsoncodec.MAX_STORED_DEPTH
    if _brackets(data) > limit and jsoncodec.too_deep(payload, limit):
        # A lease could not hand it out again: refuse it now, not at every lease.
        raise QueueError(f"queue {queue!r}: item {index} payload is nested more than {limit}"
                         " levels deep; flatten it")
    return data, priority


def decode_payload(data: str | bytes) -> dict[str, Any]:
    """A stored payload as a dict, or :class:`UndeliverableError` saying why it cannot be
    handed out (a worker, an HTTP answer or a log line could not carry it)."""
    payload: Any = None
    if not jsoncodec.long_digits(data):
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            payload = None
    if payload is None:
        try:
            # orjson reads integers beyond 64 bits as floats (and refuses lone
            # surrogates): the standard library reads them exactly; no surrogate may be
            # left, no answer could encode it.
            payload = json.loads(data)
            json.dumps(payload, ensure_ascii=False).encode()
        except (ValueError, RecursionError) as exc:
            raise UndeliverableError(f"payload is not JSON that can be sent ({exc})"[:300]
                                     ) from None
    if not isinstance(payload, dict):
        raise UndeliverableError(f"payload is a JSON {type(payload).__name__}, not an object")
    limit = jsoncodec.MAX_STORED_DEPTH
    if _brackets(data) > limit and jsoncodec.too_deep(payload, limit):
        raise UndeliverableError(f"payload is nested more than {limit} levels deep")
    return payload


def peek_payload(data: str | bytes) -> dict[str, Any]:
    """A dead letter's payload for display: decoded, or its raw text when unreadable."""
    try:
        return decode_payload(data)
    except UndeliverableError:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        return {"unreadable_payload": text[:1000]}


def parse_refs(ids: Sequence[str] | str) -> list[Ref]:
    """Ids and receipts (``"17"``, ``"17#2"``) -> refs; anything else is no message: skipped.

    At most one ref can match per message, so counts are of messages: a plain id covers
    every receipt of its message, and of several receipts only the current lease's fits.
    """
    if isinstance(ids, str):
        ids = [ids]
    parsed: list[Ref] = []
    plain: set[int] = set()
    for raw in ids:
        match = _REF.fullmatch(str(raw))
        if match is None:
            continue
        num, attempt = int(match[1]), match[2]
        parsed.append(Ref(num, int(attempt) if attempt is not None else None))
        if attempt is None:
            plain.add(num)
    refs: list[Ref] = []
    seen: set[Ref] = set()
    for ref in parsed:
        if ref in seen or (ref.attempt is not None and ref.num in plain):
            continue
        seen.add(ref)
        refs.append(ref)
    return refs


def build_stats(name: str, c: QueueCounters) -> QueueStats:
    return QueueStats(
        name=name,
        total=c.total,
        left=c.ready + c.leased,
        ready=c.ready,
        leased=c.leased,
        success=c.success,
        failed=c.failed,
        retried=c.retried,
        dead=c.dead,
        max_attempts=c.max_attempts,
        failed_by_reason={"max_attempts": c.failed_max_attempts,
                          "undeliverable": c.failed_undeliverable,
                          "nacked": c.failed_nacked},
    )


def encode_groups(
    groups: Mapping[str, Sequence[tuple[dict[str, Any], int]]],
) -> dict[str, list[tuple[str, int]]]:
    """Check and encode the items of a multi-queue push (empty groups dropped)."""
    encoded: dict[str, list[tuple[str, int]]] = {}
    for name, items in groups.items():
        check_queue_name(name)
        rows = [encode_item(item, i, name) for i, item in enumerate(items)]
        if rows:
            encoded[name] = rows
    return encoded


class BaseQueue(ABC):
    """The public queue methods, once: check arguments, encode, then call the backend."""

    def __init__(self, name: str, max_attempts: int | None = None) -> None:
        self.name = check_queue_name(name)
        self.max_attempts = check_max_attempts(max_attempts, f"queue {name!r}")

    def configure(self, max_attempts: int | None) -> None:
        """Set the delivery limit (``None`` keeps the current one)."""
        if max_attempts is not None:
            self.max_attempts = check_max_attempts(max_attempts, f"queue {self.name!r}")

    @property
    def limit(self) -> int:
        """The limit a backend script is given: 0 means the stored one, else the default."""
        return self.max_attempts or 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    async def push(self, payload: dict[str, Any], priority: int = 0) -> str:
        return (await self.push_many([(payload, priority)]))[0]

    async def push_many(self, items: Sequence[tuple[dict[str, Any], int]]) -> list[str]:
        rows = [encode_item(item, i, self.name) for i, item in enumerate(items)]
        if not rows:
            return []
        return [str(num) for num in await self._push(rows)]

    async def lease(self, n: int = 1, visibility_timeout: float = 60.0) -> list[Message]:
        place = f"queue {self.name!r} lease"
        check_count(n, "n", place)
        rows = await self._lease(n, check_timeout(visibility_timeout, place))
        messages = []
        for row in rows:
            try:
                payload = decode_payload(row.data)
            except UndeliverableError as exc:
                await self._set_aside(row, f"{UNDELIVERABLE}{exc}")
                continue
            messages.append(Message(str(row.num), payload, row.priority, row.attempts, row.until))
        return messages

    async def _set_aside(self, row: Row, reason: str) -> None:
        """Dead-letter one message of a lease so the rest of the batch is delivered."""
        log.warning("queue %r: message %d goes to the dead letter: %s", self.name, row.num,
                    reason)
        try:
            await self._nack([Ref(row.num, row.attempts)], True, clip_reason(reason))
        except CrawlhubError:
            # Its lease expires and a later lease sets it aside again.
            log.exception("queue %r: could not dead-letter message %d", self.name, row.num)

    async def ack(self, ids: Sequence[str]) -> int:
        refs = parse_refs(ids)
        return await self._ack(refs) if refs else 0

    async def nack(self, ids: Sequence[str], *, dead: bool = False,
                   reason: str | None = None) -> int:
        refs = parse_refs(ids)
        if not refs:
            return 0
        if not reason and dead:
            reason = "nacked to the dead letter"
        return await self._nack(refs, bool(dead), clip_reason(reason) if reason else None)

    async def extend(self, ids: Sequence[str], visibility_timeout: float) -> int:
        timeout = check_timeout(visibility_timeout, f"queue {self.name!r} extend")
        refs = parse_refs(ids)
        return await self._extend(refs, timeout) if refs else 0

    async def requeue_expired(self) -> int:
        return await self._requeue_expired()

    async def requeue_leased(self) -> int:
        return await self._requeue_expired(everything=True)

    async def length(self) -> int:
        return await self._length()

    async def stats(self) -> QueueStats:
        return build_stats(self.name, await self._counters())

    async def dead_letters(self, n: int = 100) -> list[Message]:
        check_count(n, "n", f"queue {self.name!r} dead_letters")
        return [
            Message(str(r.num), peek_payload(r.data), r.priority, r.attempts, 0.0, r.reason)
            for r in await self._dead_letters(n)
        ]

    async def purge(self) -> int:
        return await self._purge()

    # The backend's part: rows are valid, refs deduplicated and non-empty.

    # Every method that ends leases honours the delivery limit (:attr:`limit`): a lease
    # ending after the limit's delivery, by expiry or a nack to ready, dead-letters the
    # message with :func:`spent_reason`. A configured limit is stored by ``_push``.

    @abstractmethod
    async def _push(self, rows: list[tuple[str, int]]) -> list[int]:
        """Store ``(payload JSON, priority)`` rows in one atomic step; return their numbers."""

    @abstractmethod
    async def _lease(self, n: int, timeout: float) -> list[Row]:
        """End expired leases, then lease up to ``n`` by (priority desc, number asc)."""

    @abstractmethod
    async def _ack(self, refs: list[Ref]) -> int: ...

    @abstractmethod
    async def _nack(self, refs: list[Ref], dead: bool, reason: str | None) -> int: ...

    @abstractmethod
    async def _extend(self, refs: list[Ref], timeout: float) -> int: ...

    @abstractmethod
    async def _requeue_expired(self, everything: bool = False) -> int:
        """End expired leases (``everything``: all leases) as one storage call."""

    @abstractmethod
    async def _length(self) -> int: ...

    @abstractmethod
    async def _counters(self) -> QueueCounters: ...

    @abstractmethod
    async def _dead_letters(self, n: int) -> list[Row]: ...

    @abstractmethod
    async def _purge(self) -> int: ...

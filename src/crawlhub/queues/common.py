"""What every queue backend shares: argument checks, JSON encoding, message and stats assembly.

:class:`BaseQueue` implements the public :class:`ReliableQueue` methods once; a backend
only stores and moves already-validated rows in its ``_underscored`` methods.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crawlhub import jsoncodec
from crawlhub.errors import QueueError
from crawlhub.queues.base import Message, QueueStats

#: Priorities are 32-bit signed ints: both backends store them exactly.
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1

_NAME = re.compile(r"[^\s{}#]{1,200}")
#: An id or receipt: ASCII digits that fit a 64-bit integer (``"17"``, ``"17#2"``).
_REF = re.compile(r"([0-9]{1,18})(?:#([0-9]{1,18}))?")


@dataclass(frozen=True, slots=True)
class Ref:
    """A message id as given to ack/nack/extend; ``attempt`` is set when it was a receipt."""

    num: int
    attempt: int | None = None


@dataclass(slots=True)
class Counters:
    """Raw counters a backend reads in one atomic step; :func:`build_stats` names them."""

    total: int = 0
    success: int = 0
    failed: int = 0
    retried: int = 0
    ready: int = 0
    leased: int = 0
    dead: int = 0


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise QueueError(
            f"queue name {name!r} is invalid: use 1-200 characters without whitespace, "
            "'{', '}' or '#' (e.g. the outbound name)"
        )
    return name


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
    except (TypeError, ValueError) as exc:
        raise QueueError(
            f"queue {queue!r}: item {index} payload is not JSON-serialisable ({exc}); "
            "convert it to plain dicts, lists, strings and numbers first"
        ) from None
    return data, priority


def decode_payload(data: str | bytes) -> dict[str, Any]:
    payload: dict[str, Any] = jsoncodec.loads(data)
    return payload


def message(num: int, data: str | bytes, priority: int, attempts: int, until: float) -> Message:
    return Message(str(num), decode_payload(data), int(priority), int(attempts), float(until))


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


def build_stats(name: str, c: Counters) -> QueueStats:
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
    )


def encode_groups(
    groups: Mapping[str, Sequence[tuple[dict[str, Any], int]]],
) -> dict[str, list[tuple[str, int]]]:
    """Check and encode the items of a multi-queue push (empty groups dropped)."""
    encoded: dict[str, list[tuple[str, int]]] = {}
    for name, items in groups.items():
        check_name(name)
        rows = [encode_item(item, i, name) for i, item in enumerate(items)]
        if rows:
            encoded[name] = rows
    return encoded


class BaseQueue(ABC):
    """The public queue methods, once: check arguments, encode, then call the backend."""

    def __init__(self, name: str) -> None:
        self.name = check_name(name)

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
        return await self._lease(n, check_timeout(visibility_timeout, place))

    async def ack(self, ids: Sequence[str]) -> int:
        refs = parse_refs(ids)
        return await self._ack(refs) if refs else 0

    async def nack(self, ids: Sequence[str], *, dead: bool = False) -> int:
        refs = parse_refs(ids)
        return await self._nack(refs, bool(dead)) if refs else 0

    async def extend(self, ids: Sequence[str], visibility_timeout: float) -> int:
        timeout = check_timeout(visibility_timeout, f"queue {self.name!r} extend")
        refs = parse_refs(ids)
        return await self._extend(refs, timeout) if refs else 0

    async def requeue_expired(self) -> int:
        return await self._requeue_expired()

    async def length(self) -> int:
        return await self._length()

    async def stats(self) -> QueueStats:
        return build_stats(self.name, await self._counters())

    async def dead_letters(self, n: int = 100) -> list[Message]:
        check_count(n, "n", f"queue {self.name!r} dead_letters")
        return await self._dead_letters(n)

    async def purge(self) -> int:
        return await self._purge()

    # The backend's part: rows are valid, refs deduplicated and non-empty.

    @abstractmethod
    async def _push(self, rows: list[tuple[str, int]]) -> list[int]:
        """Store ``(payload JSON, priority)`` rows in one atomic step; return their numbers."""

    @abstractmethod
    async def _lease(self, n: int, timeout: float) -> list[Message]:
        """Requeue expired leases, then lease up to ``n`` by (priority desc, number asc)."""

    @abstractmethod
    async def _ack(self, refs: list[Ref]) -> int: ...

    @abstractmethod
    async def _nack(self, refs: list[Ref], dead: bool) -> int: ...

    @abstractmethod
    async def _extend(self, refs: list[Ref], timeout: float) -> int: ...

    @abstractmethod
    async def _requeue_expired(self) -> int: ...

    @abstractmethod
    async def _length(self) -> int: ...

    @abstractmethod
    async def _counters(self) -> Counters: ...

    @abstractmethod
    async def _dead_letters(self, n: int) -> list[Message]: ...

    @abstractmethod
    async def _purge(self) -> int: ...

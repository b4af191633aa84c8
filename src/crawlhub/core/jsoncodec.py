"""Compact JSON for the hot paths (queue payloads, the hub's ledger): orjson, with the
standard library for the rare values orjson refuses (integers beyond 64 bits).

``dumps_strict`` refuses NaN and infinities like ``json.dumps(allow_nan=False)``; orjson
alone would write them as ``null``, silently changing the data. :data:`MAX_DEPTH` is the
one nesting limit of the whole service: every intake path refuses deeper JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import orjson

from crawlhub.core.errors import CrawlhubError

#: How deep a task may nest: a flat object is depth 1, each object or array inside adds
#: one. Every intake (HTTP bodies, inbounds, Hub.submit/check_task, frontier add) refuses
#: deeper JSON, because what is accepted must also come back out: encoders give up near
#: 255 levels (orjson, pydantic) and answers wrap a task in a few more.
MAX_DEPTH = 100
#: What a stored message may hold: a task plus the envelopes crawlhub puts around it
#: (``task_params_wrapped``, a lease answer). Queues refuse to push deeper payloads and
#: dead-letter deeper ones they find, so a lease never fails on them.
MAX_STORED_DEPTH = MAX_DEPTH + 8

_CONTAINERS = (dict, list, tuple)
#: Types whose values need no look inside (exact types: a subclass takes the long way).
_PLAIN = frozenset({str, int, bool, type(None)})


class TooDeepError(CrawlhubError, ValueError):
    """JSON nested deeper than a limit (:data:`MAX_DEPTH` for tasks)."""

    def __init__(self, what: str, limit: int = MAX_DEPTH) -> None:
        self.limit = limit
        super().__init__(
            f"{what} is nested more than {limit} levels deep; crawlhub accepts JSON at most"
            f" {limit} levels deep (MAX_DEPTH): flatten it"
        )


def json_shape(value: Any, limit: int = MAX_DEPTH) -> tuple[bool, bool]:
    """``(too_deep, finite)`` of ``value`` in one pass: whether it nests more than
    ``limit`` levels, and whether it holds no NaN or infinity (a float that
    :func:`dumps` would write as ``null``). Containers are dicts, lists and tuples,
    subclasses included (a :class:`~crawlhub.core.task.Task` is a dict). Iterative: any
    depth is safe. Stops at the first level over ``limit`` (``finite`` then covers only
    the levels walked). Cost: one type test per value, the hot path of every intake."""
    if not isinstance(value, _CONTAINERS):
        return False, not (type(value) is float and value - value != 0.0)
    finite = True
    level, items = 1, [value]
    while items:
        if level > limit:
            return True, finite
        nested = []
        for item in items:
            for child in item.values() if isinstance(item, dict) else item:
                kind = type(child)
                if kind in _PLAIN:
                    continue
                if kind is float:
                    if child - child != 0.0:  # NaN - NaN and inf - inf are NaN
                        finite = False
                elif isinstance(child, _CONTAINERS):
                    nested.append(child)
        items = nested
        level += 1
    return False, finite


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests more than ``limit`` levels (iterative: any depth is safe)."""
    return json_shape(value, limit)[0]


def check_depth(value: Any, what: str = "the task", limit: int = MAX_DEPTH) -> None:
    """Raise :class:`TooDeepError` naming ``what`` when ``value`` is nested too deeply."""
    if too_deep(value, limit):
        raise TooDeepError(what, limit)


def dumps(value: Any) -> str:
    """Compact UTF-8 JSON text (NaN and infinities become ``null``)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def dumpb(value: Any) -> bytes:
    """:func:`dumps` as UTF-8 bytes, for a store that takes bytes (no decode and encode
    again). Text that UTF-8 cannot carry (a lone surrogate) raises ``ValueError``."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def dumps_strict(value: Any, *, finite: bool = False) -> str:
    """Like :func:`dumps`, but NaN and infinities raise ``ValueError``. ``finite``: the
    caller has seen (:func:`json_shape`) that ``value`` holds neither, so the text is
    not searched again."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _checked(text, value, finite).decode()


def dumpb_strict(value: Any, *, finite: bool = False) -> bytes:
    """:func:`dumps_strict` as UTF-8 bytes (a lone surrogate raises ``ValueError``)."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode()
    return _checked(text, value, finite)


def _checked(text: bytes, value: Any, finite: bool) -> bytes:
    # orjson writes NaN as null: only a text with a null can hide one.
    if not finite and b"null" in text and not json_shape(value, sys.maxsize)[1]:
        raise ValueError("NaN and Infinity are not JSON; send null or a number instead")
    return text


#: Every byte but the digits as a space, the digits as "0" (see :func:`long_digits`).
_DIGITS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_RUN = b"0" * 19


def long_digits(data: str | bytes) -> bool:
    """Whether ``data`` has a run of 19 digits anywhere: a cheap over-approximation of
    "holds an integer orjson cannot read exactly". orjson reads an integer beyond 64 bits
    as a float (3.x: 2**64 + 1 comes back as 1.8446744073709552e19), so such a text is
    read by the standard library instead, which keeps it exact."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return _LONG_RUN in raw.translate(_DIGITS)


def loads(data: str | bytes) -> Any:
    """``data`` parsed, integers of any size exact (see :func:`long_digits`)."""
    if long_digits(data):
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)

"""Compact JSON for the hot paths (queue payloads, the hub's ledger): orjson, with the
standard library for the rare values orjson refuses (integers beyond 64 bits).

``dumps_strict`` refuses NaN and infinities like ``json.dumps(allow_nan=False)``; orjson
alone would write them as ``null``, silently changing the data. :data:`MAX_DEPTH` is the
one nesting limit of the whole service: every intake path refuses deeper JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from crawlhub.core.errors import CrawlhubError

_INFINITIES = (math.inf, -math.inf)

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


class TooDeepError(CrawlhubError, ValueError):
    """JSON nested deeper than a limit (:data:`MAX_DEPTH` for tasks)."""

    def __init__(self, what: str, limit: int = MAX_DEPTH) -> None:
        self.limit = limit
        super().__init__(
            f"{what} is nested more than {limit} levels deep; crawlhub accepts JSON at most"
            f" {limit} levels deep (MAX_DEPTH): flatten it"
        )


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests more than ``limit`` levels (iterative: any depth is safe)."""
    if not isinstance(value, _CONTAINERS):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            return True
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, _CONTAINERS):
                stack.append((child, level + 1))
    return False


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


def dumps_strict(value: Any) -> str:
    """Like :func:`dumps`, but NaN and infinities raise ``ValueError``."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # orjson writes NaN as null: only a text with a null can hide one.
    if b"null" in text and not _finite(value):
        raise ValueError("NaN and Infinity are not JSON; send null or a number instead")
    return text.decode()


def _finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if item != item or item in _INFINITIES:
                return False
        elif kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return True


def loads(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # orjson refuses integers beyond 64 bits; the standard library reads them.
        return json.loads(data)

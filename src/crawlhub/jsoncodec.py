"""Compact JSON for the hot paths (queue payloads, the hub's ledger): orjson, with the
standard library for the rare values orjson refuses (integers beyond 64 bits).

``dumps_strict`` refuses NaN and infinities like ``json.dumps(allow_nan=False)``; orjson
alone would write them as ``null``, silently changing the data.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

_INFINITIES = (math.inf, -math.inf)


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

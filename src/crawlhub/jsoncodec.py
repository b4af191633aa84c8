"""Compact JSON for the hot paths (queue payloads, the hub's ledger): orjson, with the
standard library for the rare values orjson refuses (integers beyond 64 bits).

Strict like ``json.dumps(allow_nan=False)``: NaN and infinities raise ``ValueError``
(orjson alone would write them as ``null``, silently changing the data).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """Compact UTF-8 JSON text; raises ``TypeError``/``ValueError`` for what JSON can't hold."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if b"null" in text and not _finite(value):
        raise ValueError("NaN and Infinity are not JSON; send null or a number")
    return text.decode()


def _finite(value: Any) -> bool:
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(_finite(v) for v in value.values())
    if kind is list or kind is tuple:
        return all(_finite(v) for v in value)
    return True


def loads(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # orjson refuses integers beyond 64 bits; the standard library reads them.
        return json.loads(data)

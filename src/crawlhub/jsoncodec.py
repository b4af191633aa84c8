"""Compact JSON for the hot paths (queue payloads, the hub's ledger): orjson, with the
standard library for the rare values orjson refuses (integers beyond 64 bits)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """Compact UTF-8 JSON text; raises ``TypeError``/``ValueError`` for what JSON can't hold."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def loads(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # orjson refuses integers beyond 64 bits; the standard library reads them.
        return json.loads(data)

"""Durations in config values: seconds as a number, or text like "30s", "10m", "2h", "1d", "1w".

Shared by every section that takes a time span (routing timeouts, frontier segments, ...).
"""

from __future__ import annotations

import math
import re

_UNIT_SECONDS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d|w)", re.IGNORECASE)

_HINT = (
    "expected seconds as a number >= 0 or a string like '30s', '10m', '2h', '1d', '1w' "
    "(combinations like '1h30m' work too)"
)


def parse_duration(value: object) -> float:
    """Return ``value`` as float seconds; raise ``ValueError`` naming the value and the fix.

    Numbers (and numeric strings) are seconds; strings take the units ms, s, m, h, d, w
    and may combine them: ``"1h30m"`` is 5400.0.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: {_HINT}")
    if isinstance(value, int | float):
        return _check(float(value), value)
    if not isinstance(value, str):
        raise ValueError(f"invalid duration {value!r}: {_HINT}")
    text = value.strip()
    try:
        return _check(float(text), value)
    except ValueError:
        pass
    total = 0.0
    pos = 0
    matched = False
    while pos < len(text):
        match = _PART.match(text, pos)
        if match is None:
            raise ValueError(f"invalid duration {value!r}: {_HINT}")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
        pos = match.end()
        matched = True
    if not matched:
        raise ValueError(f"invalid duration {value!r}: {_HINT}")
    return total


def _check(seconds: float, original: object) -> float:
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {original!r}: {_HINT}")
    return seconds

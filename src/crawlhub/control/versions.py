"""Which build ``latest`` means: the highest version, by one documented ordering, never
merely the last build (a replayed old release tag must not move ``latest`` back).

Order, highest last: versions that are neither PEP 440 nor semver (``nightly``, ``dev``),
by build; then semver versions that PEP 440 cannot read (``1.0.0-alpha.beta``), by semver
precedence; then PEP 440 versions (``1.4.0``, ``2.0rc1``, ``2024.5.1``), by PEP 440
(``packaging.version``). Equal versions (a rebuild, ``1.0`` and ``1.0.0``): the newer build.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from packaging.version import InvalidVersion, Version

_SEMVER = re.compile(
    r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$")


def semver_key(version: str) -> tuple[Any, ...] | None:
    """Semver 2.0.0 precedence as a sortable tuple (build metadata ignored), or None."""
    m = _SEMVER.match(version)
    if m is None:
        return None
    major, minor, patch, pre = m.groups()
    # a release ranks above its pre-releases; numeric identifiers below alphanumeric ones
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")) \
        if pre else ()
    return (int(major), int(minor), int(patch), 0 if pre else 1, ids)


def version_key(version: str) -> tuple[int, Any]:
    """``(rank, key)``: rank 2 for PEP 440, 1 for semver only, 0 for anything else."""
    try:
        return 2, Version(version)
    except InvalidVersion:
        pass
    key = semver_key(version)
    return (1, key) if key is not None else (0, ())


def highest(builds: Iterable[tuple[int, str]]) -> int | None:
    """The id of the build that is ``latest`` among ``(build id, version)`` pairs (ids
    grow with time), or None when there is none."""
    best: tuple[int, Any, int] | None = None
    for build_id, version in builds:
        rank, key = version_key(version)
        candidate = (rank, key, int(build_id))
        if best is None or candidate > best:
            best = candidate
    return None if best is None else best[2]

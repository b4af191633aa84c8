"""Time segments: a key is admitted once per segment, so a later segment recrawls it.

The default resolver cuts UTC time into fixed spans (``1d``, ``6h``, ``1w``) counted
from the Unix epoch; a seed with a future ``not_before`` belongs to that later segment.
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol, runtime_checkable

from crawlhub.core.errors import ConfigError
from crawlhub.core.loading import import_object
from crawlhub.frontier.config import FrontierConfig
from crawlhub.frontier.seed import Seed


@runtime_checkable
class SegmentResolver(Protocol):
    """Maps a seed to its segment number and a segment to the time it opens.

    Segment numbers must grow with time: the frontier dispatches a segment's seeds from
    ``start_of(segment)`` on, and frees the dedup filters of segments before the
    current one (``segment_of(now)``).
    """

    def segment_of(self, seed: Seed | None, now: float) -> int:
        """The segment ``seed`` is admitted into at time ``now`` (None: the current one)."""
        ...

    def start_of(self, segment: int) -> float:
        """Unix time at which ``segment`` opens."""
        ...

    def label(self, segment: int) -> str:
        """A human name of ``segment`` for stats (e.g. ``2024-05-01``)."""
        ...


class TimeSegments:
    """Fixed-length UTC segments: segment n covers ``[n * seconds, (n + 1) * seconds)``."""

    def __init__(self, seconds: float) -> None:
        if seconds < 1:
            raise ConfigError(f"segment length {seconds}s is under 1s: use e.g. '6h' or '1d'",
                              key="frontier.segment")
        self.seconds = float(seconds)

    def __repr__(self) -> str:
        return f"TimeSegments({self.seconds:g}s)"

    def segment_of(self, seed: Seed | None, now: float) -> int:
        t = now
        if seed is not None and seed.not_before is not None and seed.not_before > now:
            t = seed.not_before
        return math.floor(t / self.seconds)

    def start_of(self, segment: int) -> float:
        return segment * self.seconds

    def label(self, segment: int) -> str:
        start = self.start_of(segment)
        if self.seconds % 86400 == 0:
            return time.strftime("%Y-%m-%d", time.gmtime(start))
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))


def segment_resolver(config: FrontierConfig) -> SegmentResolver:
    """The resolver ``config`` names: ``segment_resolver`` (import path) or TimeSegments.

    The import path may name a resolver object, or a class/factory called with
    ``seconds=config.segment``.
    """
    if not config.segment_resolver:
        return TimeSegments(config.segment)
    target: Any = import_object(config.segment_resolver, key="frontier.segment_resolver")
    resolver = target
    if not hasattr(target, "segment_of") or isinstance(target, type):
        if not callable(target):
            raise ConfigError(
                f"{config.segment_resolver!r} is neither a segment resolver nor a factory of one",
                key="frontier.segment_resolver",
            )
        resolver = target(seconds=config.segment)
    if not isinstance(resolver, SegmentResolver):
        raise ConfigError(
            f"{config.segment_resolver!r} gave {resolver!r}, which lacks segment_of / start_of / "
            "label: implement crawlhub.frontier.SegmentResolver",
            key="frontier.segment_resolver",
        )
    return resolver


class FixedSegment:
    """Every seed in one segment, open since the epoch: a frontier whose segments are
    runs, not time spans (``crawlhub crawl --recrawl`` counts them in its data dir)."""

    def __init__(self, segment: int) -> None:
        self.segment = segment

    def __repr__(self) -> str:
        return f"FixedSegment({self.segment})"

    def segment_of(self, seed: Seed | None, now: float) -> int:
        return self.segment

    def start_of(self, segment: int) -> float:
        return 0.0

    def label(self, segment: int) -> str:
        return f"run {segment}"

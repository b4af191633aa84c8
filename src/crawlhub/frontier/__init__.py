"""The frontier: canonical keys, time segments, bloom dedup and a resumable seed store.

Public face over keys, segments, bloom, store (the protocol; sqlite / redis, opened by
open_store) and manager.
"""

from typing import TYPE_CHECKING

from crawlhub.core.lazy import lazy_face

if TYPE_CHECKING:  # the names below, imported on first use (start-up: crawlhub.core.lazy)
    from crawlhub.frontier.manager import Frontier, build_frontier, open_frontiers
    from crawlhub.frontier.open import open_store
    from crawlhub.frontier.seed import Outcome, Seed
    from crawlhub.frontier.segments import SegmentResolver, TimeSegments, segment_resolver
    from crawlhub.frontier.store import Entry, SeedStore, SegmentCounts
    from crawlhub.frontier.urlkeys import KeyExplanation, KeyResolver

__all__ = [
    "Entry",
    "Frontier",
    "KeyExplanation",
    "KeyResolver",
    "Outcome",
    "Seed",
    "SeedStore",
    "SegmentCounts",
    "SegmentResolver",
    "TimeSegments",
    "build_frontier",
    "open_frontiers",
    "open_store",
    "segment_resolver",
]

__getattr__, __dir__ = lazy_face(__name__, {
    "Frontier": "crawlhub.frontier.manager",
    "build_frontier": "crawlhub.frontier.manager",
    "open_frontiers": "crawlhub.frontier.manager",
    "open_store": "crawlhub.frontier.open",
    "Outcome": "crawlhub.frontier.seed",
    "Seed": "crawlhub.frontier.seed",
    "SegmentResolver": "crawlhub.frontier.segments",
    "TimeSegments": "crawlhub.frontier.segments",
    "segment_resolver": "crawlhub.frontier.segments",
    "Entry": "crawlhub.frontier.store",
    "SeedStore": "crawlhub.frontier.store",
    "SegmentCounts": "crawlhub.frontier.store",
    "KeyExplanation": "crawlhub.frontier.urlkeys",
    "KeyResolver": "crawlhub.frontier.urlkeys",
})

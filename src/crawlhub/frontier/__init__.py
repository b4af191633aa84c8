"""The frontier: canonical keys, time segments, bloom dedup and a resumable seed store.

Public face over keys, segments, bloom, store (the protocol; sqlite / redis, opened by
open_store) and manager.
"""

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

"""Politeness across agents: the :class:`DomainGate` (per-domain concurrency, delay
between starts, 429 / 503 / Retry-After backoff) and robots.txt, shared by every agent
on one backend (a SQLite file, or a Redis server).

One file per piece: :mod:`.gate` (the gate agents call), :mod:`.robots` (the shared
robots.txt cache), :mod:`.base` (rules, records and the :class:`GateStore` protocol),
:mod:`.sqlite` and :mod:`.redis` (the stores). :func:`open_gate` builds a gate from a
URL - the ``storage.agents`` setting, where the agent registry lives too. Slots follow
the lease convention of :mod:`crawlhub.core.clock`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from crawlhub.agents.politeness.adaptive import AdaptiveState, Feedback, feedback_of
from crawlhub.agents.politeness.base import (
    DomainFigures,
    DomainRules,
    GateStore,
    Grant,
    Release,
    RobotsEntry,
)
from crawlhub.agents.politeness.gate import (
    BACKOFF_STATUSES,
    DomainGate,
    Sleep,
    Slot,
    domain_of,
    retry_after_seconds,
)
from crawlhub.agents.politeness.robots import (
    DEFAULT_ERROR_TTL,
    DEFAULT_TTL,
    MAX_BYTES,
    Refusal,
    RobotsCache,
    RobotsFetcher,
    http_fetcher,
    origin_of,
)
from crawlhub.backends.backend import Backend
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.keys import DEFAULT_PREFIX

__all__ = [
    "BACKOFF_STATUSES",
    "AdaptiveState",
    "DomainFigures",
    "Feedback",
    "feedback_of",
    "DomainGate",
    "DomainRules",
    "GateStore",
    "Grant",
    "Refusal",
    "Release",
    "RobotsCache",
    "RobotsEntry",
    "Slot",
    "domain_of",
    "open_gate",
    "open_gate_store",
    "origin_of",
    "retry_after_seconds",
]


#: The gate's store on each kind of storage (imported when chosen).
STORES = {
    "sqlite": "crawlhub.agents.politeness.sqlite:SqliteGateStore",
    "redis": "crawlhub.agents.politeness.redis:RedisGateStore",
}


def open_gate_store(url: str | Backend, *, prefix: str = DEFAULT_PREFIX) -> GateStore:
    """The gate's store on ``url``: a SQLite file or a Redis/Valkey server."""
    backend = Backend.parse(url, kinds=STORES, what="domain gate", key="storage.agents")
    store: GateStore = backend.open(STORES, redis={"prefix": prefix})
    return store


def open_gate(url: str | Backend, *, prefix: str = DEFAULT_PREFIX, rules: DomainRules | None = None,
              domains: Mapping[str, DomainRules] | None = None, robots: bool = False,
              user_agent: str = "crawlhub", robots_ttl: float = DEFAULT_TTL,
              robots_error_ttl: float = DEFAULT_ERROR_TTL, robots_max_bytes: int = MAX_BYTES,
              fetcher: RobotsFetcher | None = None, clock: Clock = system_clock,
              sleep: Sleep = asyncio.sleep) -> DomainGate:
    """A :class:`DomainGate` on ``url``; ``robots`` turns robots.txt checks on (fetched
    with ``fetcher``, by default aiohttp sending ``user_agent``)."""
    store = open_gate_store(url, prefix=prefix)
    cache = None
    if robots:
        cache = RobotsCache(store, fetcher or http_fetcher(user_agent), ttl=robots_ttl,
                            error_ttl=robots_error_ttl, max_bytes=robots_max_bytes,
                            clock=clock, sleep=sleep)
    return DomainGate(store, rules=rules, domains=domains, robots=cache,
                      user_agent=user_agent, clock=clock, sleep=sleep)

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
from collections.abc import Mapping, Sequence

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
    "domain_figures",
    "domain_of",
    "metrics_text",
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


async def domain_figures(url: str | Backend, *, prefix: str = DEFAULT_PREFIX,
                         limit: int = 100, clock: Clock = system_clock) -> list[DomainFigures]:
    """The adaptive figures of the ``limit`` domains answered last on ``url`` (the
    ``storage.agents`` backend), for the agents page and ``/metrics``."""
    store = open_gate_store(url, prefix=prefix)
    try:
        return await store.figures(clock(), limit)
    finally:
        await store.close()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_text(figures: Sequence[DomainFigures]) -> str:
    """``figures`` in Prometheus' text format: one gauge family per figure, a sample per
    domain (label ``domain``), and the answers counted by outcome."""
    families = [
        ("crawlhub_domain_concurrency_limit", "Requests at once allowed to the domain now",
         "gauge", lambda f: f.limit),
        ("crawlhub_domain_delay_seconds", "Seconds between two request starts",
         "gauge", lambda f: f.delay),
        ("crawlhub_domain_latency_seconds", "Moving average of the domain's latency",
         "gauge", lambda f: f.latency),
        ("crawlhub_domain_error_rate", "Moving share of overloads (429/503/timeouts)",
         "gauge", lambda f: f.error_rate),
        ("crawlhub_domain_in_flight", "Slots of the domain held now", "gauge",
         lambda f: f.held),
        ("crawlhub_domain_backoff_seconds", "Seconds of Retry-After pause left", "gauge",
         lambda f: f.backoff),
    ]
    lines: list[str] = []
    for name, what, kind, value in families:
        lines += [f"# HELP {name} {what}.", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{domain="{_label(f.domain)}"}} {float(value(f))!r}' for f in figures]
    name = "crawlhub_domain_answers_total"
    lines += [f"# HELP {name} Answers that fed the domain's adaptive limits.",
              f"# TYPE {name} counter"]
    for f in figures:
        d = _label(f.domain)
        lines += [f'{name}{{domain="{d}",outcome="ok"}} {f.ok}',
                  f'{name}{{domain="{d}",outcome="overload"}} {f.errors}']
    return "\n".join(lines) + "\n"

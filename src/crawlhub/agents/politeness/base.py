"""What the domain gate keeps on its backend: per-domain slot leases and pace, and the
shared robots.txt cache; the :class:`GateStore` protocol both backends implement.

Callers: :class:`crawlhub.agents.politeness.DomainGate` (every agent process) and
:class:`crawlhub.agents.politeness.robots.RobotsCache`. Every method is one round trip
(one Lua script or one SQLite transaction) and follows :mod:`crawlhub.core.clock`: ``now``
is the caller's, slot leases are absolute expiries, and an expired slot is freed by the
first acquire that sees it, in the same atomic step that grants slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from crawlhub.agents.politeness.adaptive import Feedback


@dataclass(frozen=True, slots=True)
class DomainRules:
    """How politely one domain is fetched, by every agent on the same backend.

    ``concurrency``: requests to the domain at once, across all agents. ``delay``:
    seconds between two request starts (0: none; when set, each acquire grants one
    slot). ``lease``: seconds after which a slot never released (its agent was killed)
    comes back by itself; the gate renews the slots it holds every third of it, so a
    request may run longer, and a killed agent's slots are back within it. ``backoff``:
    seconds the
    whole domain pauses after a 429 or 503 without ``Retry-After``; ``backoff_cap``:
    the longest pause a ``Retry-After`` can ask for.

    ``adaptive`` (:mod:`.adaptive`): ``concurrency`` becomes the target the domain's
    limit climbs to from ``start`` while the server keeps up, and ``delay`` the floor of
    a delay that rises on overload; a response ``tolerance`` times slower than the
    domain's baseline counts as the server queueing; ``max_delay`` caps the delay. A 429
    or 503 without ``Retry-After`` then cuts the limit and raises the delay instead of
    pausing the domain for ``backoff`` (a ``Retry-After`` is still obeyed).
    """

    concurrency: int = 2
    delay: float = 0.0
    lease: float = 15.0
    backoff: float = 30.0
    backoff_cap: float = 600.0
    adaptive: bool = False
    start: int = 1
    tolerance: float = 2.0
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"per-domain concurrency must be at least 1, not"
                             f" {self.concurrency!r}")
        for name in ("delay", "backoff", "backoff_cap"):
            if getattr(self, name) < 0:
                raise ValueError(f"per-domain {name} must be >= 0, not {getattr(self, name)!r}")
        if self.lease <= 0:
            raise ValueError(f"slot lease must be > 0 seconds, not {self.lease!r}")
        if self.start < 1:
            raise ValueError(f"adaptive start concurrency must be at least 1, not"
                             f" {self.start!r}")
        if not self.tolerance > 1:
            raise ValueError(f"adaptive latency tolerance must be > 1 (a factor of the"
                             f" baseline latency), not {self.tolerance!r}")
        if not self.max_delay >= self.delay:
            raise ValueError(f"adaptive max_delay ({self.max_delay!r}) must be >= delay"
                             f" ({self.delay!r})")


@dataclass(frozen=True, slots=True)
class Grant:
    """An acquire's answer: the slot ids granted (maybe none) and, if none, how long
    until one may be (``wait`` seconds) and why: ``"full"`` (every slot is held; the
    wait runs to the earliest lease expiry, a release may come sooner) or ``"pace"``
    (the delay between starts or a backoff; nothing frees the domain sooner)."""

    ids: list[str]
    wait: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Release:
    """One slot handed back: ``backoff_until`` (epoch seconds, or None) pauses its whole
    domain until then (a later pause already set is kept). ``feedback`` (adaptive
    rules only: ``rules`` set) is what its response said about the server."""

    domain: str
    slot: str
    backoff_until: float | None = None
    feedback: Feedback | None = None
    rules: DomainRules | None = None


@dataclass(frozen=True, slots=True)
class DomainFigures:
    """One domain's politeness as every agent sees it: ``limit`` (requests at once
    allowed now), ``delay`` (seconds between starts), ``latency`` and ``base`` (moving
    average and baseline, seconds), ``error_rate`` (moving share of overloads), answers
    ``ok`` / ``errors``, ``held`` slots now, ``backoff`` seconds of pause left, ``updated``
    (epoch seconds of the last answer)."""

    domain: str
    limit: float
    delay: float
    latency: float
    base: float
    error_rate: float
    ok: int
    errors: int
    held: int
    backoff: float
    updated: float


@dataclass(frozen=True, slots=True)
class RobotsEntry:
    """A robots.txt as fetched: ``status`` (HTTP status, or 0 when the server could not
    be reached), ``body`` (at most the gate's size limit) and ``expires`` (epoch
    seconds)."""

    status: int
    body: bytes
    expires: float


@runtime_checkable
class GateStore(Protocol):
    """Slots, pace and robots.txt entries on one backend, shared by every process."""

    async def acquire(self, domain: str, n: int, now: float, rules: DomainRules,
                      token: str) -> Grant:
        """Atomically free the domain's expired slots, then grant up to ``n`` slots
        (fewer if fewer are free; one when ``rules.delay`` is set) leased until
        ``now + rules.lease``, named ``<token>:<i>``; or none, with the wait and why."""
        ...

    async def release(self, releases: Sequence[Release], now: float) -> None:
        """Free the slots (an unknown or expired one is ignored) and set the backoffs,
        in one step for all of them."""
        ...

    async def extend(self, slots: Sequence[tuple[str, str, float]], now: float) -> int:
        """Move the expiry of each ``(domain, slot, until)`` still held (unexpired at
        ``now``) to ``until``; a slot already expired stays gone (it may have been given
        to another agent). Returns how many were extended."""
        ...

    async def reset(self) -> None:
        """Forget every slot, pace and backoff of every domain, and every claim to fetch a
        robots.txt (the robots.txt files cached stay)."""
        ...

    async def held(self, domain: str, now: float) -> int:
        """Slots of the domain held now (unexpired), for stats and tests."""
        ...

    async def figures(self, now: float, limit: int = 100) -> list[DomainFigures]:
        """The adaptive figures of the ``limit`` domains answered last, newest first."""
        ...

    async def robots_get(self, origin: str) -> RobotsEntry | None:
        """The cached robots.txt of ``origin`` (``scheme://host[:port]``), fresh or not."""
        ...

    async def robots_claim(self, origin: str, now: float, until: float) -> bool:
        """Take the right to fetch ``origin``'s robots.txt until ``until``: True only if
        no fresh entry is cached and nobody else holds an unexpired claim."""
        ...

    async def robots_put(self, origin: str, entry: RobotsEntry, now: float) -> None:
        """Cache ``entry`` for ``origin`` and end the fetch claim."""
        ...

    async def close(self) -> None: ...

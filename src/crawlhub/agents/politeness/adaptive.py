"""Adaptive politeness: one domain's concurrency limit and delay between starts, moved
by every response's latency and outcome, shared by every agent on the gate's backend.

Like Scrapy's AutoThrottle with a target concurrency, but on the limit as well as the
delay (a congestion window, as TCP and Netflix's concurrency-limits do):

- the limit starts at ``start``, doubles every round trip while the server keeps up (slow
  start, left without a cut at the first answer halfway from the baseline to the tolerance,
  with a cut at one slower than the tolerance), then grows by one a round trip (additive
  increase), never past the target
  (``DomainRules.concurrency``);
- a response slower than ``tolerance`` times the domain's baseline latency (the server is
  queueing) cuts the limit by a fifth; an overload (429, 502, 503, 504, a timeout or a
  refused connection) halves it and doubles the delay (at least the latency divided by the
  limit, AutoThrottle's target delay) - at most one cut a round trip, since the responses
  of one round trip all saw the same load;
- healthy responses take the delay back down by a tenth each, to the rules' floor.

:func:`step` is the rule; the SQLite store runs it in its release transaction and the
Redis store's ``release.lua`` runs the same arithmetic in Lua (the conformance test feeds
both one history and compares).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Weight of a new latency sample in the moving average.
LATENCY_WEIGHT = 0.3
#: Weight of a new outcome in the moving error rate.
ERROR_WEIGHT = 0.1
#: How fast the baseline latency follows a slower server upwards (per response).
BASE_DRIFT = 0.002
#: Factors a cut multiplies the limit by: on overload, on latency alone.
OVERLOAD_CUT = 0.5
SLOW_CUT = 0.8
#: The least delay an overload sets (seconds), when latency says less.
MIN_BACKOFF_DELAY = 0.05
#: Share of the delay above its floor kept after each healthy response.
DELAY_DECAY = 0.9
#: Statuses that say the server is overloaded (not that the page is bad).
OVERLOAD_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(slots=True)
class AdaptiveState:
    """One domain's adaptive figures as its store keeps them.

    ``limit`` concurrency allowed now (fractional: it grows by ``1/limit`` an answer);
    ``delay`` seconds between starts; ``latency`` moving average and ``base`` baseline
    (seconds); ``error_rate`` moving share of overloads; ``cut`` when the limit was last
    cut; ``slow_start`` 1 until the first cut; ``ok`` / ``errors`` answers counted;
    ``updated`` time of the last answer.
    """

    limit: float
    delay: float = 0.0
    latency: float = 0.0
    base: float = 0.0
    error_rate: float = 0.0
    cut: float = 0.0
    slow_start: int = 1
    ok: int = 0
    errors: int = 0
    updated: float = 0.0


@dataclass(frozen=True, slots=True)
class Feedback:
    """What one response says about its domain: ``latency`` seconds (None: not measured)
    and whether the server was ``overloaded``."""

    latency: float | None
    overloaded: bool


def feedback_of(status: int | None, latency: float | None, failed: bool = False
                ) -> Feedback:
    """A response's feedback: ``status`` (None: no response), ``failed`` a timeout or a
    connection that failed (the server could not answer: overload too)."""
    overloaded = failed or (status is not None and status in OVERLOAD_STATUSES)
    if latency is not None and not (0.0 <= latency < 1e6):  # NaN, negative, absurd
        latency = None
    return Feedback(latency, overloaded)


def tolerance_above(tolerance: float) -> float:
    """Where slow start ends, as a multiple of the baseline: halfway to ``tolerance``."""
    return 1.0 + (tolerance - 1.0) / 2.0


def step(state: AdaptiveState | None, fb: Feedback, now: float, *, target: int, start: int,
         tolerance: float, floor: float, max_delay: float) -> AdaptiveState:
    """The domain's state after one answer (``state`` None: the domain's first)."""
    s = state if state is not None else AdaptiveState(limit=float(min(start, target)),
                                                      delay=floor)
    if fb.latency is not None:
        s.latency = fb.latency if s.latency <= 0 else \
            s.latency + LATENCY_WEIGHT * (fb.latency - s.latency)
        if s.base <= 0 or s.latency < s.base:
            s.base = s.latency
        else:
            s.base += BASE_DRIFT * (s.latency - s.base)
    s.error_rate += ERROR_WEIGHT * ((1.0 if fb.overloaded else 0.0) - s.error_rate)
    slow = s.base > 0 and s.latency > tolerance * s.base
    if s.slow_start and fb.latency is not None and s.base > 0:
        if fb.latency > tolerance * s.base:
            slow = True  # doubling each round trip outruns the average: leave on one sample
        elif fb.latency > tolerance_above(tolerance) * s.base:
            # the server began queueing: stop doubling before the next doubling overshoots
            # (HyStart's delay increase), no cut - additive increase takes over
            s.slow_start = 0
    if fb.overloaded or slow:
        if fb.overloaded:
            s.errors += 1
        else:
            s.ok += 1
        if now - s.cut >= max(s.latency, MIN_BACKOFF_DELAY):
            s.cut = now
            s.slow_start = 0
            s.limit = max(1.0, s.limit * (OVERLOAD_CUT if fb.overloaded else SLOW_CUT))
            if fb.overloaded:
                s.delay = min(max_delay, max(2 * s.delay, s.latency / s.limit,
                                             MIN_BACKOFF_DELAY, floor))
    else:
        s.ok += 1
        s.limit = min(float(target), s.limit + (1.0 if s.slow_start else 1.0 / s.limit))
        s.delay = floor + DELAY_DECAY * (s.delay - floor)
        if s.delay - floor < 0.001:
            s.delay = floor
    s.limit = min(s.limit, float(target))
    s.updated = now
    return s

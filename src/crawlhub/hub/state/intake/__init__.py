"""The intake half of the hub ledger: a new task is recorded before it is pushed and
marked pushed after, so neither a failed push nor a killed process loses it.

Beside the ledger, in the same SQLite file or Redis server (so every hub process sees
them): ``unpushed`` (uuid -> when its push began) with its ``owner`` (the hub process
pushing it), the hub processes ``alive`` (instance -> last heartbeat), and the frontier
``gates`` the records hold (``frontier, segment, key`` -> uuid; ``''``: a gate whose push
failed, free to take over; ``+uuid``: a gate taken over, *inherited*). Mixed into the
state classes of :mod:`crawlhub.hub.state`; the hub's intake stage
(:mod:`crawlhub.hub.intake`) drives them.

``intake_begin`` answers per task: ``N`` new (recorded unpushed, owned by the caller);
``T`` new, and it took over a released gate (the URL was admitted for a task whose push
failed: push this one, whatever the frontier says now); ``A`` already routed (a task
with this uuid is recorded, pushed or being pushed: not pushed again); ``D`` its gate is
held by another task being pushed (a duplicate URL). A record whose owner stopped
beating is claimed by another process's ``intake_claim`` (recovery), which pushes it:
an inherited gate's holder at once, any other gated record only if the frontier
admitted its URL for it (:meth:`Frontier.admitted_by`).

One file per backend: :mod:`.base` (the record, the answers, gate names), :mod:`.sqlite`
and :mod:`.redis` (the mixins). Every time here is a lease on the hub's clock
(:mod:`crawlhub.core.clock`).
"""

from __future__ import annotations

from crawlhub.hub.state.intake.base import (
    ALREADY_ROUTED,
    GATE_HELD,
    NEW,
    RECORDED_AGAIN,
    TOOK_OVER,
    Intake,
    QueueGroup,
    gate_of,
    parse_gate,
)
from crawlhub.hub.state.intake.redis import RedisIntake
from crawlhub.hub.state.intake.sqlite import INTAKE_SCHEMA, SqliteIntake

__all__ = [
    "ALREADY_ROUTED",
    "GATE_HELD",
    "INTAKE_SCHEMA",
    "NEW",
    "RECORDED_AGAIN",
    "TOOK_OVER",
    "Intake",
    "QueueGroup",
    "RedisIntake",
    "SqliteIntake",
    "gate_of",
    "parse_gate",
]

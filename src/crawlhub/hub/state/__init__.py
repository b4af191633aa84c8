"""The hub's shared state: the ledger of dispatched tasks, per-outbound counters and
token buckets, on SQLite (one process) or Redis (every hub process sees the same).

The ledger is what makes results and lost-task detection work: a dispatched task is
recorded with a deadline; a result settles it (in one atomic step: the entry closed or
replaced by the next dispatch, the counters moved); a deadline passing leases it to one
sweeping process as lost. What a settle leaves to do (push the next dispatch, log the
failure) stays leased in the ledger until done, so a process killed in between loses
nothing: the next sweep finishes it.

One file per backend: :mod:`.base` (the :class:`HubState` protocol and the ledger
entry), :mod:`.sqlite`, :mod:`.redis`; :func:`open_state` picks one from a URL.
Leases and deadlines follow the convention of :mod:`crawlhub.core.clock`.
"""

from __future__ import annotations

from crawlhub.backends.backend import Backend
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.hub.state.base import (
    CLAIM_LEASE,
    COUNTER_FIELDS,
    DEFAULT_RETENTION,
    RATE_KEEP,
    HubState,
    LedgerEntry,
    Settle,
)
from crawlhub.hub.state.redis import RedisHubState
from crawlhub.hub.state.sqlite import SqliteHubState

__all__ = [
    "CLAIM_LEASE",
    "COUNTER_FIELDS",
    "DEFAULT_RETENTION",
    "RATE_KEEP",
    "HubState",
    "LedgerEntry",
    "RedisHubState",
    "Settle",
    "SqliteHubState",
    "open_state",
]


#: The hub state of each kind of storage.
STATES = {"sqlite": SqliteHubState, "redis": RedisHubState}


def open_state(url: str | Backend, *, prefix: str = DEFAULT_PREFIX) -> HubState:
    """The hub state on ``url``: a SQLite file or a Redis/Valkey server."""
    backend = Backend.parse(url, kinds=STATES, what="hub state", key="storage.state")
    state: HubState = backend.open(STATES, redis={"prefix": prefix})
    return state

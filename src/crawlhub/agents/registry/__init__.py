"""The agent registry: agents register once, heartbeat separately, and are listed with
their liveness; the download center's list of live agents.

One file per backend: :mod:`.base` (the :class:`AgentRegistry` protocol and its
records), :mod:`.sqlite`, :mod:`.redis`; :func:`open_registry` picks one from a URL (the
``storage.agents`` setting, which defaults to ``storage.state``). Liveness follows the
lease convention of :mod:`crawlhub.core.clock`.
"""

from __future__ import annotations

from crawlhub.agents.registry.base import (
    DEFAULT_DEAD_AFTER,
    DEFAULT_RETENTION,
    AgentInfo,
    AgentRegistry,
    AgentStatus,
    Heartbeat,
    LoadMeter,
    listing,
    resident_bytes,
)
from crawlhub.backends.backend import Backend
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.keys import DEFAULT_PREFIX

__all__ = [
    "DEFAULT_DEAD_AFTER",
    "DEFAULT_RETENTION",
    "AgentInfo",
    "AgentRegistry",
    "AgentStatus",
    "Heartbeat",
    "LoadMeter",
    "listing",
    "open_registry",
    "resident_bytes",
]


#: The agent registry of each kind of storage (imported when chosen).
REGISTRIES = {
    "sqlite": "crawlhub.agents.registry.sqlite:SqliteAgentRegistry",
    "redis": "crawlhub.agents.registry.redis:RedisAgentRegistry",
}


def open_registry(url: str | Backend, *, prefix: str = DEFAULT_PREFIX,
                  dead_after: float = DEFAULT_DEAD_AFTER,
                  retention: float = DEFAULT_RETENTION,
                  clock: Clock = system_clock) -> AgentRegistry:
    """The agent registry on ``url``: a SQLite file or a Redis/Valkey server."""
    if dead_after <= 0 or retention < 0:
        raise ValueError(f"dead_after must be > 0 and retention >= 0, got {dead_after!r},"
                         f" {retention!r}")
    backend = Backend.parse(url, kinds=REGISTRIES, what="agent registry", key="storage.agents")
    registry: AgentRegistry = backend.open(REGISTRIES, dead_after=dead_after,
                                           retention=retention, clock=clock,
                                           redis={"prefix": prefix})
    return registry

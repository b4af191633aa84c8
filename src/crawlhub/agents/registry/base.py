"""The agent registry protocol: who is downloading, where, and whether it is still alive.

Callers: every agent process (``crawlhub agent``, ``crawlhub crawl``) registers once when
it starts and heartbeats every few seconds; ``GET /agents/`` and ``crawlhub agents`` list
the agents with their liveness; the download center (issue 9) asks for the live agents
before each allocation, so :meth:`AgentRegistry.live` is one cheap round trip.

Liveness follows :mod:`crawlhub.core.clock`: the registry reads ``now`` from the clock it was
given; an agent is alive while its last registration or heartbeat is less than
``dead_after`` seconds old (11 s by default: two missed beats of the agent's 5 s
interval and a second's grace). A dead agent stays listed as dead for ``retention``
seconds after it went silent, then is forgotten; a heartbeat from a forgotten agent
answers False and the agent registers again.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

#: Seconds of silence after which an agent is dead.
DEFAULT_DEAD_AFTER = 11.0
#: Seconds a dead agent stays listed before it is forgotten.
DEFAULT_RETENTION = 3600.0


@dataclass(slots=True)
class AgentInfo:
    """What an agent says once, when it registers (fixed for the life of its process).

    ``queues`` are the outbound queues it leases from; ``concurrency`` the most requests
    it runs at once (the download center's capacity); ``labels`` free ``name -> value``
    tags an allocation strategy may match (region, proxy pool...).
    """

    agent_id: str
    host: str
    pid: int
    version: str
    queues: list[str] = field(default_factory=list)
    started: float = 0.0
    concurrency: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentInfo:
        """Read a stored registration; fields a newer version added are ignored."""
        return cls(
            agent_id=str(data["agent_id"]), host=str(data.get("host", "")),
            pid=int(data.get("pid", 0)), version=str(data.get("version", "")),
            queues=[str(q) for q in data.get("queues") or []],
            started=float(data.get("started") or 0.0),
            concurrency=int(data.get("concurrency") or 0),
            labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
        )


@dataclass(slots=True)
class Heartbeat:
    """What an agent reports on every beat: its load now and its counters so far.

    ``memory`` is its resident size in bytes; ``cpu`` percent of one core since the last
    beat; ``downloaders`` the download slots busy (an agent of the download center: the
    job downloaders open); ``in_flight`` requests under way; ``qps`` requests per second
    since the last beat; ``pages`` and ``errors`` count since the agent started; ``jobs``
    the download center's jobs allocated to it.
    """

    memory: int = 0
    cpu: float = 0.0
    downloaders: int = 0
    in_flight: int = 0
    qps: float = 0.0
    pages: int = 0
    errors: int = 0
    jobs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Heartbeat:
        return cls(
            memory=int(data.get("memory") or 0), cpu=float(data.get("cpu") or 0.0),
            downloaders=int(data.get("downloaders") or 0),
            in_flight=int(data.get("in_flight") or 0), qps=float(data.get("qps") or 0.0),
            pages=int(data.get("pages") or 0), errors=int(data.get("errors") or 0),
            jobs=[str(j) for j in data.get("jobs") or []],
        )


class LoadMeter:
    """The memory and CPU fields of a :class:`Heartbeat` for this process: resident size
    now (``/proc/self/statm``; the peak from ``getrusage`` where there is no ``/proc``)
    and the percent of one core used since the previous :meth:`sample`."""

    def __init__(self, cpu_clock: Callable[[], float] = time.process_time,
                 wall_clock: Callable[[], float] = time.monotonic) -> None:
        self._cpu_clock = cpu_clock
        self._wall_clock = wall_clock
        self._last = (cpu_clock(), wall_clock())

    def sample(self) -> tuple[int, float]:
        """``(memory bytes, cpu percent)`` since the last sample (or the meter's start)."""
        cpu, wall = self._cpu_clock(), self._wall_clock()
        used, spent = cpu - self._last[0], wall - self._last[1]
        self._last = (cpu, wall)
        percent = 100.0 * used / spent if spent > 0 else 0.0
        return resident_bytes(), round(max(0.0, percent), 1)


def resident_bytes() -> int:
    """This process's resident memory in bytes (0 if the platform does not say)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):
        return 0


@dataclass(slots=True)
class AgentStatus:
    """One agent as listed: its registration, its last heartbeat (None before the
    first), when it was last heard from (epoch seconds) and whether it is alive."""

    info: AgentInfo
    beat: Heartbeat | None
    last_seen: float
    alive: bool

    @property
    def agent_id(self) -> str:
        return self.info.agent_id

    def as_dict(self) -> dict[str, Any]:
        """The flat form ``GET /agents/`` and ``crawlhub agents --json`` show."""
        beat = self.beat or Heartbeat()
        return {**self.info.as_dict(), **beat.as_dict(), "last_seen": self.last_seen,
                "alive": self.alive, "beats": self.beat is not None}


@runtime_checkable
class AgentRegistry(Protocol):
    """Agents registered on one backend (SQLite file or Redis), shared by every process
    that opens the same URL. Every method is one round trip (one Lua script, pipeline or
    SQLite transaction)."""

    #: Seconds of silence after which an agent is dead.
    dead_after: float
    #: Seconds a dead agent stays listed before it is forgotten.
    retention: float

    async def register(self, info: AgentInfo, *, at: float | None = None) -> None:
        """Record ``info`` and count it as a sign of life (now, or at ``at``, the agent's
        own stamp: then the last sign of life never moves back). Registering an id again
        (a restarted agent) replaces its registration and drops its last heartbeat."""
        ...

    async def heartbeat(self, agent_id: str, beat: Heartbeat) -> bool:
        """Store ``beat`` as the agent's latest and mark it alive now. False (nothing
        stored) if the agent is not registered - forgotten after its retention, or never
        registered: the agent must :meth:`register` again."""
        ...

    async def heartbeat_many(self, beats: Sequence[tuple[str, Heartbeat]], *,
                             at: Sequence[float] | None = None) -> list[bool]:
        """:meth:`heartbeat` for several agents (a process running many) in one trip.
        ``at``: each beat's own stamp (the download center passes the agents' clocks,
        not the time it processed the beats); a beat older than the agent's last sign of
        life is not stored, so a replayed beat cannot revive a dead agent."""
        ...

    async def unregister(self, agent_id: str) -> bool:
        """Forget the agent at once (a clean shutdown); False if it was not known."""
        ...

    async def get(self, agent_id: str) -> AgentStatus | None:
        """One agent, alive or dead; None if unknown or forgotten."""
        ...

    async def agents(self) -> list[AgentStatus]:
        """Every agent still known, alive and dead, sorted by id. Forgets first, in the
        same step, agents silent for longer than ``dead_after + retention``."""
        ...

    async def live(self) -> list[str]:
        """Ids of the agents alive now, sorted: the download center's hot path (one
        range read on an index of last-seen times, no registration decoded)."""
        ...

    async def forget_dead(self) -> int:
        """Forget agents silent for longer than ``dead_after + retention``; how many."""
        ...

    async def close(self) -> None: ...


async def listing(registry: AgentRegistry, alive: bool | None = None,
                  more: Sequence[AgentRegistry] = ()) -> dict[str, Any]:
    """The ``GET /agents/`` body (also ``crawlhub agents --json``): every agent known,
    sorted by id (only the live or the dead ones with ``alive``), and how many of all are
    alive and dead. ``more``: other registries (the download center's, on another
    server); an agent known to several is listed once, as last seen."""
    found: dict[str, AgentStatus] = {}
    for source in (registry, *more):
        for status in await source.agents():
            held = found.get(status.agent_id)
            if held is None or status.last_seen > held.last_seen:
                found[status.agent_id] = status
    rows = [found[i].as_dict() for i in sorted(found)]
    live = sum(1 for r in rows if r["alive"])
    dead = len(rows) - live
    if alive is not None:
        rows = [r for r in rows if r["alive"] is alive]
    return {"dead_after": registry.dead_after, "alive": live, "dead": dead, "agents": rows}

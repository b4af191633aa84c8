"""The watcher: turns what agents and queues look like now into ``agent_dead`` and
``queue_stalled`` events, and hands them to whatever notifies (the AlertService)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from crawlhub.control.alerts.model import AlertEvent
from crawlhub.core.clock import Clock

if TYPE_CHECKING:
    from crawlhub.agents.registry.base import AgentRegistry, AgentStatus

log = logging.getLogger("crawlhub.control.alerts")


#: ``async () -> {queue name: row}`` (or a list of rows with ``name``); a row has ``left``
#: and ``success``, as a mapping or as attributes.
QueueStatsFn = Callable[[], Awaitable[Mapping[str, Any] | Iterable[Any]]]


class Notifier(Protocol):
    """What the watcher hands its events to (:meth:`AlertService.notify`)."""

    async def notify(self, event: AlertEvent) -> bool: ...


class AlertWatcher:
    """Turns what agents and queues look like now into ``agent_dead`` and
    ``queue_stalled`` events, remembering what it saw between polls (one per process)."""

    def __init__(self, service: Notifier, agents: Sequence[AgentRegistry],
                 queue_stats: QueueStatsFn | None, *,
                 stall_after: float, clock: Clock) -> None:
        self.service = service
        self.agents = list(agents)
        self.queue_stats = queue_stats
        self.stall_after = stall_after
        self.clock = clock
        self._alive: dict[str, bool] = {}
        self._queues: dict[str, _QueueMark] = {}

    async def poll(self) -> list[AlertEvent]:
        """Check once and notify what changed; the events notified. A backend out of
        reach is logged and checked again next time."""
        events: list[AlertEvent] = []
        if self.agents:
            try:
                events += await self._check_agents()
            except Exception as exc:
                log.warning("alerts: cannot list the agents: %s: %s", type(exc).__name__, exc)
        if self.queue_stats is not None:
            try:
                events += self._check_queues(_by_name(await self.queue_stats()))
            except Exception as exc:
                log.warning("alerts: cannot read the queue stats: %s: %s",
                            type(exc).__name__, exc)
        for event in events:
            await self.service.notify(event)
        return events

    async def _check_agents(self) -> list[AlertEvent]:
        """Only a transition fires: an agent first seen dead (dead before this process
        started watching) does not; a clean unregister is no death."""
        seen: dict[str, AgentStatus] = {}
        for registry in self.agents:
            for status in await registry.agents():
                held = seen.get(status.agent_id)
                if held is None or status.last_seen > held.last_seen:
                    seen[status.agent_id] = status
        now = self.clock()
        dead_after = self.agents[0].dead_after
        events = []
        for agent_id, status in seen.items():
            if self._alive.get(agent_id) is True and not status.alive:
                info = status.info
                silent = max(0.0, now - status.last_seen)
                serves = ", ".join(info.queues or (status.beat.jobs if status.beat else [])
                                   ) or "nothing"
                events.append(AlertEvent(
                    kind="agent_dead", agent=agent_id, ts=now,
                    subject=f"agent {agent_id} on {info.host} is dead",
                    message=f"No heartbeat for {silent:.0f} s (dead after {dead_after:g} s)."
                            f" It served: {serves}.",
                    details={"agent_id": agent_id, "host": info.host, "pid": info.pid,
                             "queues": info.queues, "last_seen": status.last_seen,
                             "jobs": status.beat.jobs if status.beat else []}))
            self._alive[agent_id] = status.alive
        for gone in set(self._alive) - set(seen):
            del self._alive[gone]
        return events

    def _check_queues(self, stats: Mapping[str, Any]) -> list[AlertEvent]:
        now = self.clock()
        events = []
        for name, row in stats.items():
            left, success = _count(row, "left"), _count(row, "success")
            if left is None or success is None:
                continue  # its backend is out of reach: unknown, not stalled
            mark = self._queues.get(name)
            if mark is None or left <= 0 or success != mark.success:
                self._queues[name] = _QueueMark(success=success, since=now)
                continue
            stalled = now - mark.since
            if not mark.fired and stalled >= self.stall_after:
                mark.fired = True
                events.append(AlertEvent(
                    kind="queue_stalled", queue=name, ts=now,
                    subject=f"queue {name} is not draining",
                    message=f"{left} tasks left and no success for {stalled:.0f} s"
                            f" (success stays at {success}). Are its agents alive?",
                    details={"queue": name, "left": left, "success": success,
                             "failed": _count(row, "failed"), "total": _count(row, "total"),
                             "stalled_for": round(stalled, 1)}))
        for gone in set(self._queues) - set(stats):
            del self._queues[gone]
        return events


@dataclass(slots=True)
class _QueueMark:
    success: int
    since: float
    fired: bool = False


def _by_name(stats: Mapping[str, Any] | Iterable[Any]) -> Mapping[str, Any]:
    """Queue stats as ``{name: row}``: a mapping as it is, or a list of rows that carry
    their ``name`` (``hub.outbound_stats()``'s dicts, ``QueueStats``)."""
    if isinstance(stats, Mapping):
        return stats
    rows = {}
    for row in stats:
        name = row.get("name") if isinstance(row, Mapping) else getattr(row, "name", None)
        if isinstance(name, str):
            rows[name] = row
    return rows


def _count(row: Any, name: str) -> int | None:
    value = row.get(name) if isinstance(row, Mapping) else getattr(row, name, None)
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None

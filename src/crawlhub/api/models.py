"""The bodies the API answers, as pydantic models: the OpenAPI document shows them and
the web page renders the same objects (``crawlhub.web`` imports them from here).

Rows allow extra keys: a backend may report more than is declared here, and the answer
carries it as it is. Numbers that may be whole or not are ``int | float``, so an int
stays an int in the JSON. Error bodies live in :mod:`crawlhub.api.openapi`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from crawlhub.core.configtypes import new_list

__all__ = [
    "Acked",
    "AgentList",
    "AgentRow",
    "BatchAnswer",
    "CenterJob",
    "CenterJobs",
    "DeadLetter",
    "FrontierStats",
    "FrontierTotals",
    "Health",
    "InboundRow",
    "LeasedMessage",
    "Nacked",
    "OutboundRow",
    "QueueStatsRow",
    "SegmentStats",
    "TaskAnswer",
]


class _Row(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------------- tasks, inbounds
class TaskAnswer(_Row):
    """What happened to one task: ``status`` is ``routed``, ``duplicate``, ``rejected``,
    ``already_routed``, ``deferred`` or ``unavailable``; ``reason`` says why when it was
    not routed."""

    task_uuid: str | None
    status: str
    outbound: str | None = None
    reason: str | None = None


class BatchAnswer(_Row):
    """A list of tasks: how many were routed, and each task's answer in order."""

    accepted: int
    tasks: list[TaskAnswer]


class InboundRow(_Row):
    """One inbound entry of the config (``GET /inbound/``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str
    class_: str = Field(alias="class", description="http, redis, kafka or an import path")
    disabled: bool
    derive: bool = Field(description="every message is a new task derived from a result")
    selector: list[str] = Field(description="the inbound's selectors (none: every message)")
    frontier: str | None = Field(description="the frontier that admits its new tasks")


# ---------------------------------------------------------------------- outbounds, queues
class OutboundRow(_Row):
    """One outbound: its config (secrets masked) and counters. ``available`` is false when
    its backend is out of reach; ``queue_length`` / ``left`` are then null and ``error``
    says why."""

    name: str
    disabled: bool = False
    available: bool = True
    error: str | None = None
    queue_length: int | None
    left: int | None
    total: int
    success: int
    failed: int
    retried: int
    rerouted: int = 0
    failback: int = 0
    timeout: int = 0
    orphan: int = Field(0, description="results that named no waiting task")
    rate: float = Field(description="tasks dispatched per second over the last 10 s, by"
                        " every hub process")
    config: dict[str, Any]


class QueueStatsRow(_Row):
    """Counters of one reliable queue (``GET /queues/``); see
    :class:`crawlhub.queues.base.QueueStats` for what each counts."""

    name: str
    total: int = Field(description="messages ever pushed")
    left: int = Field(description="ready + leased")
    ready: int
    leased: int
    success: int = Field(description="acked")
    failed: int = Field(description="moved to the dead letter")
    retried: int = Field(description="nacked back to ready, or expired leases returned")
    dead: int = Field(description="in the dead letter now")
    max_attempts: int = Field(description="deliveries without an ack before the dead letter")
    failed_by_reason: dict[str, int] = Field(default_factory=dict,
                                             description="failed, by max_attempts,"
                                             " undeliverable or nacked")


class LeasedMessage(BaseModel):
    id: str = Field(description="the message id (ack/nack it by id or by receipt)")
    receipt: str = Field(description="id#attempt: acks/nacks only this lease")
    payload: dict[str, Any]
    priority: int
    attempts: int = Field(description="deliveries so far, this one included; at the"
                          " queue's max_attempts an unacked lease ends in the dead letter")
    lease_until: float = Field(description="epoch seconds when the lease returns unacked")


class DeadLetter(BaseModel):
    id: str
    payload: dict[str, Any] = Field(description="the payload, or {\"unreadable_payload\":"
                                    " text} when it cannot be read")
    priority: int
    attempts: int
    reason: str | None = Field(description="why it died, e.g. 'delivered 10 times without"
                               " ack'")


class Acked(BaseModel):
    acked: int = Field(description="messages finished by this call")


class Nacked(BaseModel):
    nacked: int = Field(description="messages returned (or dead-lettered) by this call")


# ---------------------------------------------------------------------- agents, center
class AgentRow(BaseModel):
    agent_id: str
    host: str
    pid: int
    version: str
    queues: list[str] = Field(description="the outbound queues it leases from")
    started: float = Field(description="epoch seconds when it started")
    concurrency: int = Field(description="the most requests it runs at once")
    labels: dict[str, str]
    memory: int = Field(description="resident memory, bytes (last heartbeat)")
    cpu: float = Field(description="percent of one core since the heartbeat before")
    downloaders: int = Field(description="download slots busy")
    in_flight: int = Field(description="requests under way")
    qps: float = Field(description="requests per second since the heartbeat before")
    pages: int = Field(description="pages fetched since it started")
    errors: int = Field(description="failed fetches since it started")
    jobs: list[str] = Field(default_factory=new_list,
                            description="the download center's jobs allocated to it")
    last_seen: float = Field(description="epoch seconds of its last registration or"
                             " heartbeat")
    alive: bool = Field(description="heard from within dead_after seconds")
    beats: bool = Field(description="false until its first heartbeat (load fields are 0)")


class AgentList(BaseModel):
    dead_after: float = Field(description="seconds of silence after which an agent is dead")
    alive: int
    dead: int
    agents: list[AgentRow]


class CenterJob(BaseModel):
    job: str
    strategy: str = Field(description="random, fixed or chained")
    n: int = Field(description="agents asked for")
    agents: list[str] = Field(description="the agents allocated")
    created: float = Field(description="epoch seconds of the allocation")
    center: str = Field(description="the center that allocated it")
    sent: int = Field(description="requests sent (first sends)")
    returned: int = Field(description="requests answered")
    in_flight: int = Field(description="requests waiting for their answer")
    failed: int = Field(description="requests failed: no live agent, or unanswered")
    skipped: int = Field(description="chained requests whose agent was dead")
    retried: int = Field(description="sends again after a reply timeout")
    reported: float | None = Field(description="epoch seconds of the job's last report")


class CenterJobs(BaseModel):
    jobs: list[CenterJob]


# ---------------------------------------------------------------------- frontier
class FrontierTotals(_Row):
    """A frontier's counters summed over its segments."""

    admitted: int = Field(description="seeds admitted (new in their segment)")
    duplicates: int = Field(description="seeds refused as already admitted")
    pending: int
    leased: int
    done: int
    failed: int
    dispatched: int = Field(description="admitted by the hub and routed at once")


class SegmentStats(FrontierTotals):
    """One time segment of a frontier."""

    segment: int
    label: str = Field(description="a human name of the segment, e.g. 2024-05-01")
    start: int | float = Field(description="epoch seconds when the segment begins")


class FrontierStats(_Row):
    """One frontier (``GET /frontier/``): settings, current segment, totals and
    per-segment counters, oldest segment first."""

    name: str
    backend: str = Field(description="sqlite or redis")
    current_segment: int
    current_label: str
    config: dict[str, Any]
    totals: FrontierTotals
    segments: list[SegmentStats]


# ---------------------------------------------------------------------- health
class Health(BaseModel):
    """``GET /healthz``: ``ok`` (200) or ``degraded`` (503) with the check that failed."""

    status: Literal["ok", "degraded"]
    version: str
    project: str
    checks: dict[str, str] = Field(description="state and queues: 'ok' or 'error: <type>'")

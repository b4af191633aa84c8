"""The hub: takes tasks and messages in, routes them to outbounds, handles their results.

Intake (HTTP, inbound sources) -> convert -> inbound selectors -> frontier admission ->
first matching outbound -> ledger + push. A result settles its ledger entry atomically
(terminal / retry / failback / re-route / failed, counters with it); a ledger deadline
passing is a lost task, claimed as a lease and handled as a failure with status
``timeout``.

Intake (``submit``) loses nothing and, where one store holds both, doubles nothing
(see :mod:`crawlhub.hub.intake`):

1. *record*: each task is written to the ledger as unpushed, owned by this process,
   only if its ``task_uuid`` is new (else ``already_routed``); a task behind a frontier
   also takes its gate, ``(frontier, segment, key)``, in the same step (a gate held by a
   task being pushed answers ``duplicate``);
2. *admit*: the frontier admits the gated ones (a duplicate's record and gate go);
3. *push*, then *mark pushed*: deadlines start, gates are freed, counters move.

A push that fails is undone: the record goes and the gate stays, released, so the
client's retry of the URL takes it over and is pushed (the frontier keeps the admission:
a bloom filter cannot take it back). A process killed between 1 and 3 leaves records it
owns unpushed; once it has not beaten for ``ALIVE_TTL`` seconds, ``recover_intake`` of
any hub process (every ``RECOVER_EVERY``, and at start) pushes them - a gated one only
if the frontier admitted its URL for it. Meanwhile a retry is answered
``already_routed`` / ``duplicate``: the task will be pushed.

Cost per batch: 3 round trips (record, push, mark pushed), 4 with a frontier (+ admit).
When the ledger and the queue outbounds share one Redis server, an ungated batch is
recorded and pushed by one Lua script (1 round trip) and a gated one is recorded,
admitted, then pushed and marked pushed by one script (3). A kill after a push and
before its mark cannot push a task twice there, nor on a SQLite queue, whose push
stores the task uuids as marks in the same transaction (recovery asks it first; the
marks go with a later push). Only a ``redis_list`` outbound, or queues on another Redis
than the ledger, are at least once in that window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from crawlhub import jsoncodec
from crawlhub.errors import (
    BackpressureError,
    ConfigError,
    ConvertError,
    CrawlhubError,
    FrontierError,
    NotFoundError,
    QueueError,
)
from crawlhub.frontier.store import Entry
from crawlhub.hub.converters import Converter, build_converter
from crawlhub.hub.failures import FailureLog
from crawlhub.hub.inbounds.base import InboundSource
from crawlhub.hub.intake import (
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
from crawlhub.hub.metrics import HubMetrics
from crawlhub.hub.outbounds import OutboundTransport, QueueOutbound, build_transport
from crawlhub.hub.routing import (
    OutboundRule,
    Outcome,
    ResultDecision,
    Router,
    decide_result,
    status_key,
)
from crawlhub.hub.state import CLAIM_LEASE, HubState, LedgerEntry, Settle
from crawlhub.keys import queue_keys, queue_registry
from crawlhub.loading import import_object
from crawlhub.queues.base import QueueBackend
from crawlhub.queues.common import PRIORITY_MAX, PRIORITY_MIN, encode_item
from crawlhub.selectors import SelectorSet, compile_selectors
from crawlhub.storage.errors import is_unavailable, unavailable
from crawlhub.storage.redact import redact_url
from crawlhub.task import BUILTIN_KEY_SET, RESULT_KEY, Task

log = logging.getLogger("crawlhub.hub")

#: Timeout status given to a dispatched task whose result never came.
TIMEOUT_STATUS = "timeout"
#: How long a cached outbound lag is trusted before asking the backend again.
LAG_TTL = 0.2
#: Counter a settled result moves on its outbound, by outcome.
SETTLED_FIELD = {Outcome.SUCCESS: "success", Outcome.FAILED: "failed",
                 Outcome.RETRY: "retried", Outcome.FAILBACK: "failback",
                 Outcome.REROUTE: "rerouted"}
#: Times a result is judged again when its entry changed under it before giving up.
SETTLE_TRIES = 3
#: The outbound rate is tasks dispatched over this many seconds, divided by it.
RATE_WINDOW = 10
#: Longest a dispatch count waits in one process before going to the shared counts.
RATE_FLUSH = 0.2
#: A hub process silent (no heartbeat) this many seconds is dead: the tasks it recorded
#: and did not mark pushed are pushed by the recovery of another (or its restart).
ALIVE_TTL = 3.0
#: Seconds between heartbeats, and between recovery passes, of every hub process.
BEAT_EVERY = 0.5
RECOVER_EVERY = 1.0
#: Tasks per script of the one-script push (a batch goes as several, overlapped).
FUSED_CHUNK = 50
#: Push marks (SQLite queues) a process drops with one push at most.
FORGET_MAX = 5000
#: Seconds an inbound source waits before sending tasks whose push failed again.
OUTAGE_PAUSE = 1.0


@dataclass(slots=True)
class SubmitResult:
    """What happened to one submitted task (the API answers a list of these)."""

    task_uuid: str | None = None
    outbound: str | None = None
    #: routed: pushed to ``outbound``. already_routed: a task with this task_uuid was
    #: routed and has no result yet (not pushed again). duplicate: its URL was already
    #: admitted by a frontier in this segment. rejected: no outbound takes it, or its
    #: URL is unusable. deferred: its token scope is exhausted, retry later.
    #: unavailable / failed: its push failed (a backend outage / another error); nothing
    #: of it was kept, so a retry of it is safe.
    status: str = "routed"
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task_uuid": self.task_uuid, "status": self.status}
        if self.outbound:
            out["outbound"] = self.outbound
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(slots=True)
class Inbound:
    """One inbound entry, compiled: selectors, converters and (unless http) its source."""

    name: str
    class_name: str
    selectors: SelectorSet
    converters: list[Converter]
    derive: bool = False
    frontier: str | None = None
    threads: int = 1
    disabled: bool = False
    init: dict[str, Any] = field(default_factory=dict)

    @property
    def is_http(self) -> bool:
        return self.class_name in HTTP_NAMES

    def convert(self, message: Mapping[str, Any]) -> dict[str, Any] | None:
        """Run the converters; a converter that raises is a :class:`ConvertError`."""
        data: dict[str, Any] | None = dict(message)
        for index, converter in enumerate(self.converters):
            if data is None:
                return None
            try:
                data = converter(data)
            except Exception as exc:
                raise ConvertError(
                    f"inbound {self.name!r}: convert[{index}]"
                    f" ({type(converter).__name__}) failed on a message: {exc}") from exc
        return data


class _PartlyPushed(Exception):
    """A one-script push of which some chunks failed: ``pushed`` and ``refused`` say
    what happened to each task anyway."""

    def __init__(self, error: BaseException, pushed: list[bool], refused: dict[int, str]
                 ) -> None:
        super().__init__(str(error))
        self.error, self.pushed, self.refused = error, pushed, refused


@dataclass(slots=True)
class _Todo:
    """A task on its way through intake: its index in the answer, the task stamped for
    its outbound, the outbound, its ledger record."""

    index: int
    task: Task
    rule: OutboundRule
    intake: Intake


def _same_redis(a: str, b: str) -> bool:
    """Whether two Redis URLs name the same server and database."""
    from urllib.parse import urlsplit

    def norm(url: str) -> tuple[str, str | None, int | None, str]:
        parts = urlsplit(url.replace("valkey://", "redis://", 1)
                         .replace("valkeys://", "rediss://", 1))
        host = "127.0.0.1" if parts.hostname in ("localhost", None) else parts.hostname
        return (parts.scheme, host, parts.port or 6379, parts.path.strip("/") or "0")

    return bool(a) and bool(b) and not a.startswith("sqlite") and norm(a) == norm(b)


HTTP_NAMES = frozenset({"http", "http.HttpInbound", "HttpInbound"})
REDIS_NAMES = frozenset({"redis", "redis_list", "redis_stream", "redis.RedisInbound",
                         "RedisInbound"})
KAFKA_NAMES = frozenset({"kafka", "kafka.KafkaInbound", "KafkaInbound"})


class Hub:
    """Routes tasks; see the module docstring. Build with :meth:`from_config`."""

    def __init__(
        self,
        *,
        router: Router,
        inbounds: Sequence[Inbound],
        transports: Mapping[str, OutboundTransport],
        state: HubState,
        failures: FailureLog,
        submitter: str = "crawlhub",
        frontiers: Mapping[str, Any] | None = None,
        metrics: HubMetrics | None = None,
        sources: Mapping[str, InboundSource] | None = None,
    ) -> None:
        self.router = router
        self.inbounds = {i.name: i for i in inbounds}
        self.transports = dict(transports)
        self.state = state
        self.failures = failures
        self.submitter = submitter
        self.frontiers = dict(frontiers or {})
        self.metrics = metrics or HubMetrics()
        self.sources = dict(sources or {})
        self._lag_cache: dict[str, tuple[float, int]] = {}
        self._fused_cache: dict[str, bool] = {}
        #: this process, as the owner of the tasks it records (see hub/intake/)
        self.instance = os.urandom(8).hex()
        #: what an outage kept this process from finishing (see _leftovers)
        self._leftover: list[tuple[str, _Todo]] = []
        self._forget: list[Intake] = []
        #: per queue backend (id): push marks to drop with its next push
        self._forget_marks: dict[int, list[str]] = {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Dispatch counts not yet added to the shared rate counts (see _note_dispatch).
        self._rate_unsent: dict[tuple[str, int], int] = {}
        self._rate_flush: asyncio.Task[None] | None = None
        self._rate_lock = asyncio.Lock()
        #: The clock of every lease this hub writes (crawlhub.clock): intake records and
        #: heartbeats, deadlines of dispatches, ledger claims, sweeps, and of the
        #: outbound rate; tests inject one.
        self.clock: Callable[[], float] = time.time
        #: Seconds a claimed lost task, or a settled result's follow-up (push, failure
        #: line), stays leased to this process before any process's sweep takes it over.
        self.lease = CLAIM_LEASE

    # ------------------------------------------------------------------ building
    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        queues: QueueBackend,
        state: HubState,
        frontiers: Mapping[str, Any] | None = None,
    ) -> Hub:
        """Compile a validated :class:`CrawlhubConfig` into a hub (errors name the entry)."""
        default_timeout = getattr(config.routing, "result_timeout", None)
        rules: list[OutboundRule] = []
        transports: dict[str, OutboundTransport] = {}
        frontiers = dict(frontiers or {})
        for ob in config.outbound:
            where = _where(ob, "outbound")
            rule = OutboundRule.from_config(ob, default_result_timeout=default_timeout)
            if rule.frontier and rule.frontier not in frontiers:
                raise ConfigError(f"frontier {rule.frontier!r} is not defined under 'frontier:'",
                                  file=where[0], entry=where[1], key="frontier")
            rules.append(rule)
            if not rule.disabled:
                transports[ob.name] = build_transport(
                    ob.name, ob.class_, dict(ob.init), queues=queues, priority=rule.priority,
                    file=where[0], entry=where[1],
                )
        inbounds: list[Inbound] = []
        sources: dict[str, InboundSource] = {}
        for ib in config.inbound:
            where = _where(ib, "inbound")
            converters = [
                build_converter(conv.class_, dict(conv.init), file=where[0], entry=where[1],
                                key=f"convert[{i}]")
                for i, conv in enumerate(ib.convert)
            ]
            inbound = Inbound(
                name=ib.name, class_name=ib.class_, selectors=compile_selectors(list(ib.selector)),
                converters=converters, derive=bool(ib.derive), frontier=ib.frontier,
                threads=int(ib.threads), disabled=bool(ib.disable), init=dict(ib.init),
            )
            if inbound.frontier and inbound.frontier not in frontiers:
                raise ConfigError(f"frontier {inbound.frontier!r} is not defined under"
                                  " 'frontier:'", file=where[0], entry=where[1], key="frontier")
            inbounds.append(inbound)
            if not inbound.disabled and not inbound.is_http:
                sources[ib.name] = build_source(inbound, file=where[0], entry=where[1])
        router = Router(rules, limits=config.routing.limits,
                        terminal_codes=config.routing.terminal_codes)
        failures = FailureLog(config.failure.path, compress=config.failure.compress)
        return cls(router=router, inbounds=inbounds, transports=transports, state=state,
                   failures=failures, submitter=config.submitter, frontiers=frontiers,
                   sources=sources)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start consuming inbound sources and watching for lost tasks."""
        self._stop.clear()
        for name, source in self.sources.items():
            self._tasks.append(asyncio.create_task(self._run_source(name, source),
                                                   name=f"inbound:{name}"))
        # Always: besides lost tasks, the sweep finishes what a process that died left
        # leased after settling a result (a push, a failure line).
        self._tasks.append(asyncio.create_task(self._sweep_forever(), name="hub:sweeper"))
        self._tasks.append(asyncio.create_task(self._beat_forever(), name="hub:beat"))
        self._tasks.append(asyncio.create_task(self._recover_forever(), name="hub:intake"))

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._rate_flush is not None:
            self._rate_flush.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._rate_flush
        await self._flush_rate()
        for transport in self.transports.values():
            with contextlib.suppress(Exception):
                await transport.close()

    async def _run_source(self, name: str, source: InboundSource) -> None:
        async def deliver(batch: list[dict[str, Any]]) -> None:
            await self.receive(name, batch, wait=True)

        while not self._stop.is_set():
            try:
                await source.run(deliver, self._stop)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("inbound %s failed; restarting it in 1 s", name)
                await asyncio.sleep(1.0)

    async def _sweep_forever(self) -> None:
        timeouts = [r.result_timeout for r in self.router.rules if r.result_timeout]
        interval = max(0.05, min(1.0, min(timeouts) / 4)) if timeouts else 1.0
        while not self._stop.is_set():
            try:
                await self.sweep_lost()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("lost-task sweep failed")
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ intake
    async def submit(self, tasks: Sequence[Mapping[str, Any]], *, wait: bool = False,
                     frontier: str | None = None) -> list[SubmitResult]:
        """Route new tasks (see "Intake" in the module docstring). Without ``wait``, an
        outbound over ``max_lag`` raises :class:`BackpressureError` before anything is
        written, tasks whose token scope is exhausted come back ``deferred``, and tasks
        whose push failed come back ``unavailable`` (when no task at all was pushed, the
        first such error is raised instead: :class:`BackendUnavailable` for an outage).
        With ``wait`` (inbound sources) all three are waited out."""
        results: list[SubmitResult] = [SubmitResult() for _ in tasks]
        plans: list[tuple[int, Task, OutboundRule]] = []
        for i, raw in enumerate(tasks):
            task = Task(raw).ensure_identity(self.submitter)
            task.pop(RESULT_KEY, None)
            results[i].task_uuid = task.task_uuid
            decision = self.router.route(task)
            if decision.outbound is None:
                results[i].status, results[i].reason = "rejected", decision.reason
                self.metrics.rejected.inc()
                continue
            plans.append((i, task, decision.outbound))
        # Backpressure first: a task refused here must not have been admitted already.
        await self._check_lag(plans, wait=wait)
        while True:
            failed = await self._intake(plans, results, frontier, wait=wait)
            if not failed:
                return results
            if not wait or not all(is_unavailable(e) for e in failed.values()):
                break
            # An inbound source waits the outage out and sends the same tasks again: the
            # uuids make it safe (what got pushed meanwhile is not pushed twice).
            log.warning("intake: %d tasks not pushed (%s); trying again in %s s",
                        len(failed), next(iter(failed.values())), OUTAGE_PAUSE)
            await asyncio.sleep(OUTAGE_PAUSE)
            plans = [p for p in plans if p[0] in failed]
            for i, task, _ in plans:
                results[i] = SubmitResult(task_uuid=task.task_uuid)
                task["routed_count"] = task.routed_count - 1  # stamped again on the way
        error = next(iter(failed.values()))
        if wait or not any(results[i].status in ("routed", "already_routed")
                           for i, _, _ in plans):
            # (an inbound source gets the batch again: its tasks that carry a task_uuid
            # and were pushed are answered already_routed then)
            raise unavailable(error) if is_unavailable(error) else error
        return results

    async def _intake(self, plans: Sequence[tuple[int, Task, OutboundRule]],
                      results: list[SubmitResult], inbound_frontier: str | None, *,
                      wait: bool) -> dict[int, BaseException]:
        """Gate, take tokens, record, admit, push, mark pushed. Fills ``results``;
        returns the errors of the tasks whose push failed (by index)."""
        now = self.clock()
        gates = self._gates(plans, results, inbound_frontier, now)
        groups: dict[str, list[tuple[int, Task]]] = defaultdict(list)
        rules: dict[str, OutboundRule] = {}
        for i, task, rule in plans:
            if results[i].status == "routed":
                groups[rule.name].append((i, task))
                rules[rule.name] = rule
        todo: list[_Todo] = []
        for name, members in groups.items():
            rule = rules[name]
            if name not in self.transports:
                raise CrawlhubError(f"outbound {name!r} is disabled or has no transport")
            allowed = await self._take_tokens(rule, len(members), wait=wait)
            for i, _ in members[allowed:]:
                results[i].status = "deferred"
                results[i].reason = (f"token scope {rule.token_scope!r} allows"
                                     f" {rule.token_per_second}/s; retry later")
            deadline = now + rule.result_timeout if rule.result_timeout else None
            for i, task in members[:allowed]:
                gate = gates.get(i)
                todo.append(_Todo(i, rule.stamp(task), rule, Intake(
                    task, name, deadline, gate_of(gate[0], gate[1].segment, gate[1].key)
                    if gate else None)))
        failed: dict[int, BaseException] = {}
        # Ungated tasks for queues on the ledger's own Redis: record and push, one script.
        fused = [t for t in todo if t.intake.gate is None and self._fused(t.rule.name)]
        if fused:
            error: BaseException | None = None
            try:
                pushed, refused = await self._push_fused("new", fused, now)
            except _PartlyPushed as partly:
                error, pushed, refused = partly.error, partly.pushed, partly.refused
            for k, (t, ok) in enumerate(zip(fused, pushed, strict=True)):
                if ok:
                    results[t.index].outbound = t.rule.name
                elif k in refused:
                    results[t.index].status = "rejected"
                    results[t.index].reason = refused[k]
                elif error is not None:
                    # (a chunk that failed, or whose answer was lost: not recorded, or
                    # recorded and pushed - then a retry of it is already_routed)
                    self._unavailable(results[t.index], error)
                    failed[t.index] = error
                else:
                    self._already_routed(results[t.index])
        rest = [t for t in todo if not (t.intake.gate is None and self._fused(t.rule.name))]
        if rest:
            failed.update(await self._record_and_push(rest, gates, results, now))
        return failed

    def _gates(self, plans: Sequence[tuple[int, Task, OutboundRule]],
               results: list[SubmitResult], inbound_frontier: str | None, now: float
               ) -> dict[int, tuple[str, Entry]]:
        """The frontier entry (segment, key) of every gated task, resolved without I/O;
        a task whose URL the frontier cannot use is rejected alone."""
        by_frontier: dict[str, list[tuple[int, Task]]] = defaultdict(list)
        for i, task, rule in plans:
            name = inbound_frontier or rule.frontier
            if name:
                by_frontier[name].append((i, task))
        gates: dict[int, tuple[str, Entry]] = {}
        for name, members in by_frontier.items():
            frontier = self.frontiers[name]
            try:
                entries = frontier.task_entries([t for _, t in members], now)
            except FrontierError:
                entries = []
                for i, task in members:
                    try:
                        entries += frontier.task_entries([task], now)
                    except FrontierError as exc:
                        entries.append(None)
                        results[i].status = "rejected"
                        results[i].reason = f"frontier {name!r}: {exc}"
            for (i, _), entry in zip(members, entries, strict=True):
                if entry is not None:
                    gates[i] = (name, entry)
        return gates

    async def _record_and_push(self, todo: list[_Todo], gates: Mapping[int, tuple[str, Entry]],
                               results: list[SubmitResult], now: float
                               ) -> dict[int, BaseException]:
        """The general path: record unpushed (one round trip), admit the gated ones (one
        per frontier), push (concurrently), mark pushed (one). Gated tasks whose URL is
        known already are answered first, with two reads (see _known)."""
        todo = await self._known(todo, gates, results)
        if not todo:
            return {}
        flags = await self.state.intake_begin([t.intake for t in todo], now, self.instance)
        go: list[_Todo] = []
        admit: dict[str, list[tuple[_Todo, str]]] = defaultdict(list)
        admitting: set[str] = set()
        for t, flag in zip(todo, flags, strict=True):
            if flag == ALREADY_ROUTED:
                self._already_routed(results[t.index])
            elif flag == GATE_HELD and t.intake.gate in admitting:
                # a repeat of a URL this batch admits: the frontier counts it, after it
                admit[gates[t.index][0]].append((t, flag))
            elif flag == GATE_HELD:
                name = gates[t.index][0]
                results[t.index].status = "duplicate"
                results[t.index].reason = (f"frontier {name!r}: another task with this URL"
                                           " is being pushed in this segment")
                self.metrics.duplicates.labels(name).inc()
            elif t.intake.gate:
                admit[gates[t.index][0]].append((t, flag))
                if flag == NEW:
                    admitting.add(t.intake.gate)
            else:
                go.append(t)
        failed: dict[int, BaseException] = {}
        for name, members in admit.items():
            try:
                verdicts = await self.frontiers[name].admit_entries(
                    [gates[t.index][1] for t, _ in members])
                pushing = await self._admitted(name, members, verdicts)
            except Exception as exc:
                # Admitted or not is unknown: the gates stay, released, for a retry.
                await self._abort([t for t, _ in members], release=True)
                for t, _ in members:
                    self._unavailable(results[t.index], exc)
                    failed[t.index] = exc
                continue
            duplicates = []
            for (t, flag), push in zip(members, pushing, strict=True):
                if push:
                    go.append(t)
                    continue
                if flag != GATE_HELD:  # (a repeat in the batch has no record to undo)
                    duplicates.append(t)
                results[t.index].status = "duplicate"
                results[t.index].reason = (f"already admitted by frontier {name!r} in"
                                           " this segment")
                self.metrics.duplicates.labels(name).inc()
            if duplicates:
                await self._abort(duplicates, release=False)
        if go:
            errors = await self._push_recorded(go, now)
            for t, error in zip(go, errors, strict=True):
                if error is None:
                    results[t.index].outbound = t.rule.name
                else:
                    self._unavailable(results[t.index], error)
                    failed[t.index] = error
        return failed

    async def _known(self, todo: list[_Todo], gates: Mapping[int, tuple[str, Entry]],
                     results: list[SubmitResult]) -> list[_Todo]:
        """Answer ``duplicate`` to the gated tasks whose URL a frontier admitted already and
        return the rest. A crawl submits mostly known links: recording each, admitting it
        and undoing the record costs three writes; this costs a read of the hub state and
        one of the frontier. Safe because the gate is read first: a URL the frontier has
        with no gate row (none held, none released untaken) was pushed, or is being
        pushed by a task that takes the gate from here on and answers a client who
        retries (the same as GATE_HELD). A read that fails leaves the task to the general
        path, which handles the outage."""
        gated = [t for t in todo if t.intake.gate]
        if not gated:
            return todo
        try:
            free = await self.state.intake_free([t.intake for t in gated])
        except Exception:  # noqa: BLE001 - the general path answers the outage
            return todo
        by_frontier: dict[str, list[_Todo]] = defaultdict(list)
        for t, ok in zip(gated, free, strict=True):
            if ok:
                by_frontier[gates[t.index][0]].append(t)
        known: set[int] = set()
        for name, members in by_frontier.items():
            try:
                flags = await self.frontiers[name].duplicates(
                    [gates[t.index][1] for t in members])
            except Exception:  # noqa: BLE001 - as above
                continue
            for t, duplicate in zip(members, flags, strict=True):
                if duplicate:
                    known.add(t.index)
                    results[t.index].status = "duplicate"
                    results[t.index].reason = (f"already admitted by frontier {name!r} in"
                                               " this segment")
                    self.metrics.duplicates.labels(name).inc()
        return [t for t in todo if t.index not in known] if known else todo

    async def _admitted(self, name: str, members: Sequence[tuple[_Todo, str]],
                        verdicts: Sequence[bool]) -> list[bool]:
        """Which gated tasks to push, given the frontier's verdicts on their URLs: new
        ones it admitted; ones holding a gate they took over (the URL was admitted for
        the task they replace); ones recorded again, if the URL was admitted for them
        (by their earlier attempt) or now. Never a repeat of a URL in the batch."""
        out = []
        for (t, flag), admitted in zip(members, verdicts, strict=True):
            if flag == GATE_HELD:
                out.append(False)
            elif admitted or flag == TOOK_OVER:
                out.append(True)
            elif flag == RECORDED_AGAIN:
                entry = self._entry_of(t)
                out.append(entry is not None and await self.frontiers[name].admitted_by(
                    entry) == t.intake.uuid)
            else:
                out.append(False)
        return out

    def _entry_of(self, t: _Todo) -> Entry | None:
        if not t.intake.gate:
            return None
        name, segment, key = parse_gate(t.intake.gate)
        frontier = self.frontiers.get(name)
        return frontier.gated_entry(t.task, segment, key) if frontier else None

    async def _push_recorded(self, todo: Sequence[_Todo], now: float, *, undo: bool = True
                             ) -> list[BaseException | None]:
        """Push recorded tasks and mark them pushed; a failed push is undone (its gate
        released) if ``undo``, else left recorded for recovery to try again (and then a
        queue that keeps push marks is asked first which were pushed already: those are
        only marked pushed). One error (or None) per task."""
        errors: list[BaseException | None] = [None] * len(todo)
        fused = [k for k, t in enumerate(todo) if self._fused(t.rule.name)]
        if fused:
            try:
                _, refused = await self._push_fused("commit", [todo[k] for k in fused], now)
            except _PartlyPushed as partly:
                missed = [k for j, k in enumerate(fused) if not partly.pushed[j]]
                if undo:
                    await self._abort([todo[k] for k in missed], release=True)
                for k in missed:
                    errors[k] = partly.error
            else:
                bad = [todo[fused[j]] for j in refused]
                for j, reason in refused.items():
                    errors[fused[j]] = QueueError(reason)
                if bad:
                    await self._abort(bad, release=True)
        others: dict[str, list[int]] = defaultdict(list)
        for k, t in enumerate(todo):
            if not self._fused(t.rule.name):
                others[t.rule.name].append(k)
        pushed: list[_Todo] = []
        if not undo:  # recovery: a push marked in its queue happened
            for name in list(others):
                backend: Any = getattr(self.transports[name], "backend", None)
                if hasattr(backend, "pushed"):
                    done = await backend.pushed([todo[k].intake.uuid for k in others[name]])
                    pushed += [todo[k] for k in others[name] if todo[k].intake.uuid in done]
                    others[name] = [k for k in others[name] if todo[k].intake.uuid not in done]
                    if not others[name]:
                        del others[name]
        ready = [(todo[ks[0]].rule, self.transports[name], [todo[k].task for k in ks])
                 for name, ks in others.items()]
        sent = await self._send(ready, marks=True) if ready else []
        lost: list[_Todo] = []
        for ks, error in zip(others.values(), sent, strict=True):
            for k in ks:
                errors[k] = error
                (lost if error is not None else pushed).append(todo[k])
        if pushed:
            counts = self._dispatched(pushed, now)
            try:
                await self.state.intake_commit([t.intake for t in pushed],
                                               [(name, "total", n) for name, n in counts.items()])
                self._note_forget(pushed)
            except Exception as exc:  # pushed all the same: marked pushed later
                log.warning("intake: %d tasks pushed but not marked pushed (%s); trying"
                            " again every %s s", len(pushed), exc, RECOVER_EVERY)
                self._leftover += [("commit", t) for t in pushed]
        if lost and undo:
            await self._abort(lost, release=True)
        return errors

    def _note_forget(self, pushed: Sequence[_Todo]) -> None:
        """Marked pushed in the ledger: their push marks can go with the next push."""
        for t in pushed:
            backend = getattr(self.transports.get(t.rule.name), "backend", None)
            if hasattr(backend, "pushed"):
                forget = self._forget_marks.setdefault(id(backend), [])
                if len(forget) < FORGET_MAX:  # (beyond, the queue's expiry drops them)
                    forget.append(t.intake.uuid)

    async def _push_fused(self, mode: str, todo: Sequence[_Todo], now: float
                          ) -> tuple[list[bool], dict[int, str]]:
        """Record (``new``) or mark pushed (``commit``) and push, in one script on the
        Redis that holds both the ledger and the queues. Returns per task whether it
        was pushed, and why (by position) those that cannot be stored were not.

        A long batch goes as scripts of FUSED_CHUNK tasks: each is sent before the next
        is encoded, so Redis runs one while Python prepares the next. A chunk that
        fails raises once every chunk sent has answered (the others' tasks stand)."""
        state: Any = self.state
        pushed = [False] * len(todo)
        refused: dict[int, str] = {}
        sent: list[tuple[list[int], Any]] = []
        error: BaseException | None = None
        for start in range(0, len(todo), FUSED_CHUNK):
            part = range(start, min(start + FUSED_CHUNK, len(todo)))
            items, groups, registry, positions = self._fused_items(mode, todo, part, refused)
            if not items:
                continue
            try:
                sent.append((positions, await state.intake_push_sent(mode, items, groups,
                                                                     registry, now)))
            except Exception as exc:
                error = exc
                break
        for positions, reply in sent:
            try:
                flags = await reply
            except Exception as exc:
                error = error or exc
                continue
            for k, ok in zip(positions, flags, strict=True):
                pushed[k] = ok
        self._dispatched([t for t, ok in zip(todo, pushed, strict=True) if ok], now)
        if error is not None:
            raise _PartlyPushed(error, pushed, refused)
        return pushed, refused

    def _fused_items(self, mode: str, todo: Sequence[_Todo], part: Iterable[int],
                     refused: dict[int, str]
                     ) -> tuple[list[tuple[Intake, int, str, int]], list[QueueGroup], str,
                                list[int]]:
        """Encode the tasks ``todo[part]`` for the one-script push: the items, the queue
        groups they go to, the queue registry key and their positions in ``todo``."""
        index: dict[str, int] = {}
        groups: list[QueueGroup] = []
        items: list[tuple[Intake, int, str, int]] = []
        positions: list[int] = []
        registry = ""
        for k in part:
            t = todo[k]
            g = index.get(t.rule.name)
            transport = self.transports[t.rule.name]
            assert isinstance(transport, QueueOutbound)
            queue = transport.queue
            if g is None:
                prefix = getattr(transport.backend, "prefix", "crawlhub:")
                registry = queue_registry(prefix)
                keys = queue_keys(prefix, queue.name)
                g = index[t.rule.name] = len(groups)
                groups.append(QueueGroup([keys[k] for k in ("ready", "payloads", "priorities",
                                                            "stats", "seq")],
                                         queue.name, t.rule.name,
                                         int(getattr(queue, "limit", 0) or 0)))
            item = (t.rule.params(t.task), _int(t.task.get("priority")))
            try:
                if mode == "new":
                    # The entry holds the whole task: checked strictly (no NaN) once, its
                    # params are encoded as they are (checked through the entry).
                    t.intake.raw = t.intake.dumps(strict=True)
                    if not PRIORITY_MIN <= item[1] <= PRIORITY_MAX:
                        raise QueueError(f"priority must be an int in [{PRIORITY_MIN},"
                                         f" {PRIORITY_MAX}], got {item[1]}")
                    payload, priority = jsoncodec.dumps(item[0]), item[1]
                else:
                    payload, priority = encode_item(item, len(items), queue.name)
            except (ValueError, TypeError, QueueError) as exc:
                refused[k] = f"cannot be stored: {exc}"
                continue
            items.append((t.intake, g, payload, priority))
            positions.append(k)
        return items, groups, registry, positions

    def _fused(self, outbound: str) -> bool:
        """True when ``outbound`` is a queue on the Redis server (and db) of the ledger."""
        fused = self._fused_cache.get(outbound)
        if fused is None:
            transport = self.transports.get(outbound)
            backend = getattr(transport, "backend", None)
            fused = (isinstance(transport, QueueOutbound)
                     and hasattr(self.state, "intake_push")
                     and hasattr(backend, "redis")
                     and _same_redis(getattr(backend, "url", ""),
                                     getattr(self.state, "url", "")))
            self._fused_cache[outbound] = fused
        return fused

    async def _abort(self, todo: Sequence[_Todo], *, release: bool) -> None:
        """Forget the records of tasks that were not pushed. If that fails too, they stay
        recorded (a retry of them is answered already_routed): this process pushes the
        ones whose push failed, and forgets the duplicates, later (``_leftovers``)."""
        try:
            await self.state.intake_abort([t.intake for t in todo], release=release)
        except Exception as exc:
            log.warning("intake: could not undo the records of %d tasks (%s); trying"
                        " again every %s s", len(todo), exc, RECOVER_EVERY)
            if release:
                self._leftover += [("push", t) for t in todo]
            else:
                self._forget += [t.intake for t in todo]

    def _dispatched(self, pushed: Iterable[_Todo], now: float) -> dict[str, int]:
        """Count pushed tasks on their outbounds (metrics, rate, cached lag); returns
        the counts by outbound."""
        counts: dict[str, int] = defaultdict(int)
        for t in pushed:
            counts[t.rule.name] += 1
        for name, n in counts.items():
            self.metrics.dispatched.labels(name).inc(n)
            self._note_dispatch(name, n, now)
            cached = self._lag_cache.get(name)
            if cached:
                self._lag_cache[name] = (cached[0], cached[1] + n)
        return counts

    @staticmethod
    def _already_routed(result: SubmitResult) -> None:
        result.status = "already_routed"
        result.reason = ("a task with this task_uuid was routed and has no result yet;"
                         " not pushed again")

    @staticmethod
    def _unavailable(result: SubmitResult, error: BaseException) -> None:
        result.status = "unavailable" if is_unavailable(error) else "failed"
        result.reason = (f"not pushed: {redact_url(f'{type(error).__name__}: {error}')};"
                         " nothing of it was kept, retry it")

    async def recover_intake(self, now: float | None = None) -> int:
        """Push the tasks a hub process recorded and did not mark pushed before it died
        (silent for :data:`ALIVE_TTL`); a gated one only if its URL was admitted for it
        (or its gate inherited). Also finishes what this process left to do after a
        backend outage. Returns how many were pushed."""
        now = self.clock() if now is None else now
        await self._leftovers(now)
        claimed = await self.state.intake_claim(now, now - ALIVE_TTL, self.instance)
        todo: list[_Todo] = []
        for intake in claimed:
            rule = self.router.by_name.get(intake.outbound)
            if rule is None or intake.outbound not in self.transports:
                log.warning("intake: task %s was recorded for outbound %r, which is gone;"
                            " dropped", intake.uuid, intake.outbound)
                self._forget.append(intake)
                continue
            todo.append(_Todo(-1, Task(intake.task), rule, intake))
        if todo:
            log.warning("intake: pushing %d tasks a stopped process recorded but did not"
                        " push", len(todo))
        return await self._recover(todo, now)

    async def _recover(self, todo: list[_Todo], now: float) -> int:
        """Push claimed records (see ``recover_intake``); what fails is kept for the
        next pass (this process owns them now: nobody else would)."""
        gated: dict[str, list[tuple[_Todo, str]]] = defaultdict(list)
        ready: list[_Todo] = []
        for t in todo:
            if self._entry_of(t) is None:
                ready.append(t)
            else:
                flag = TOOK_OVER if t.intake.inherited else RECORDED_AGAIN
                gated[parse_gate(t.intake.gate or "")[0]].append((t, flag))
        for name, members in gated.items():
            try:
                entries = [self._entry_of(t) for t, _ in members]
                verdicts = await self.frontiers[name].admit_entries([e for e in entries if e])
                pushing = await self._admitted(name, members, verdicts)
            except Exception as exc:
                log.warning("intake recovery: frontier %r failed (%s); trying again", name, exc)
                self._leftover += [("recover", t) for t, _ in members]
                continue
            ready += [t for (t, _), push in zip(members, pushing, strict=True) if push]
            # a URL admitted for another task (this one's process died after the
            # frontier called it a duplicate): nobody was told it was routed
            self._forget += [t.intake for (t, _), push in zip(members, pushing, strict=True)
                             if not push]
        if not ready:
            return 0
        errors = await self._push_recorded(ready, now, undo=False)
        self._leftover += [("recover", t) for t, e in zip(ready, errors, strict=True) if e]
        return sum(1 for e in errors if e is None)

    async def _leftovers(self, now: float) -> None:
        """Retry what an outage kept this process from finishing: marking pushed tasks
        pushed, forgetting duplicates' records, pushing tasks whose push and undo failed."""
        if self._forget:
            forget, self._forget = self._forget, []
            try:
                await self.state.intake_abort(forget, release=False)
            except Exception:
                self._forget += forget
                raise
        if not self._leftover:
            return
        todo, self._leftover = self._leftover, []
        by: dict[str, list[_Todo]] = defaultdict(list)
        for action, t in todo:
            by[action].append(t)
        try:
            if by["commit"]:
                counts: dict[str, int] = defaultdict(int)
                for t in by["commit"]:
                    counts[t.rule.name] += 1
                await self.state.intake_commit([t.intake for t in by["commit"]],
                                               [(n, "total", c) for n, c in counts.items()])
                by["commit"] = []
            if by["push"]:
                errors = await self._push_recorded(by["push"], now, undo=False)
                by["push"] = [t for t, e in zip(by["push"], errors, strict=True) if e]
            if by["recover"]:
                again, by["recover"] = by["recover"], []
                await self._recover(again, now)  # (what fails goes back on the list)
        finally:
            self._leftover += [(action, t) for action, ts in by.items() for t in ts]

    async def _beat_forever(self) -> None:
        while not self._stop.is_set():
            try:
                await self.state.intake_beat(self.instance, self.clock())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("intake heartbeat failed (%s); trying again", exc)
            await asyncio.sleep(BEAT_EVERY)

    async def _recover_forever(self) -> None:
        while not self._stop.is_set():
            try:
                await self.recover_intake()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("intake recovery failed; trying again in %s s", RECOVER_EVERY)
            await asyncio.sleep(RECOVER_EVERY)

    async def _check_lag(self, plans: Sequence[tuple[int, Task, OutboundRule]], *,
                         wait: bool) -> None:
        rules: dict[str, OutboundRule] = {}
        for _, _, rule in plans:
            if rule.max_lag > 0:
                rules[rule.name] = rule
        for name in rules:
            while True:
                lag = await self.lag(name)
                if lag < rules[name].max_lag:
                    break
                self.metrics.backpressure.labels(name).inc()
                if not wait:
                    raise BackpressureError(
                        f"outbound {name!r} holds {lag} tasks, at or over its max_lag of"
                        f" {rules[name].max_lag}; retry later", retry_after=1.0)
                await asyncio.sleep(0.5)
                self._lag_cache.pop(name, None)

    async def _send(self, ready: Sequence[tuple[OutboundRule, OutboundTransport, list[Task]]],
                    *, marks: bool = False) -> list[BaseException | None]:
        """Push every group concurrently: queue outbounds sharing a backend in one
        ``push_multi`` call, others through their transport. One error (or None) per
        group, in order. ``marks``: a backend that keeps push marks (SQLite) stores the
        task uuids with the push (intake recovery asks it), and drops those of pushes
        since marked pushed in the ledger."""
        calls: list[Any] = []
        covers: list[list[int]] = []
        shared: dict[int, tuple[QueueBackend, dict[str, list[tuple[dict[str, Any], int]]],
                                list[int]]] = {}
        for index, (rule, transport, group) in enumerate(ready):
            items = [(rule.params(t), _int(t.get("priority"))) for t in group]
            backend = getattr(transport, "backend", None)
            if isinstance(transport, QueueOutbound) and backend is not None:
                entry = shared.setdefault(id(backend), (backend, {}, []))
                # (two outbounds may push onto one queue: their items go together)
                entry[1].setdefault(transport.queue.name, []).extend(items)
                entry[2].append(index)
            else:
                calls.append(transport.send(items))
                covers.append([index])
        for key, (backend, groups, indexes) in shared.items():
            if marks and hasattr(backend, "pushed"):
                uuids = [t.task_uuid for i in indexes for t in ready[i][2]]
                forget, self._forget_marks[key] = self._forget_marks.get(key, []), []
                calls.append(self._push_marked(backend, groups, uuids, forget, key))
            else:
                calls.append(backend.push_multi(groups))
            covers.append(indexes)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        errors: list[BaseException | None] = [None] * len(ready)
        for outcome, indexes in zip(outcomes, covers, strict=True):
            if isinstance(outcome, BaseException):
                for index in indexes:
                    errors[index] = outcome
        return errors

    async def _push_marked(self, backend: Any, groups: Any, marks: list[str],
                           forget: list[str], key: int) -> None:
        try:
            await backend.push_multi(groups, marks=marks, forget=forget)
        except BaseException:
            self._forget_marks.setdefault(key, []).extend(forget)
            raise

    async def _take_tokens(self, rule: OutboundRule, n: int, *, wait: bool) -> int:
        """How many of ``n`` tasks the token scope lets through now (all, if ``wait``)."""
        rate = rule.token_per_second
        if not rate or not rule.token_scope:
            return n
        burst = max(1.0, rate)
        taken = 0
        while taken < n:
            chunk = int(min(n - taken, burst))
            delay = await self.state.take_tokens(rule.token_scope, rate, chunk, burst)
            if delay <= 0:
                taken += chunk
                continue
            if not wait:
                # Take what the bucket holds now, one at a time, rather than nothing.
                while taken < n and await self.state.take_tokens(rule.token_scope, rate, 1,
                                                                  burst) <= 0:
                    taken += 1
                return taken
            await asyncio.sleep(min(delay, 1.0))
        return taken

    async def lag(self, outbound: str) -> int:
        cached = self._lag_cache.get(outbound)
        now = time.monotonic()
        if cached and now - cached[0] < LAG_TTL:
            return cached[1]
        transport = self.transports.get(outbound)
        lag = await transport.lag() if transport else 0
        self._lag_cache[outbound] = (now, lag)
        return lag

    def _note_dispatch(self, name: str, n: int, now: float) -> None:
        """Count ``n`` tasks dispatched to ``name`` for the outbound rate every hub process
        reads. Counts gather here for up to RATE_FLUSH seconds and go to the state backend
        in one write in the background: the dispatch path pays no round trip for them."""
        key = (name, int(now))
        self._rate_unsent[key] = self._rate_unsent.get(key, 0) + n
        if self._rate_flush is None or self._rate_flush.done():
            self._rate_flush = asyncio.create_task(self._flush_rate(RATE_FLUSH),
                                                   name="hub:rate")

    async def _flush_rate(self, delay: float = 0.0) -> None:
        """Add the dispatch counts gathered so far to the shared ones (a failure costs
        the rate those counts, never a task)."""
        if delay:
            await asyncio.sleep(delay)
        async with self._rate_lock:
            unsent, self._rate_unsent = self._rate_unsent, {}
            if not unsent:
                return
            try:
                await self.state.note_dispatched(
                    [(name, second, n) for (name, second), n in unsent.items()])
            except asyncio.CancelledError:
                for key, n in unsent.items():
                    self._rate_unsent[key] = self._rate_unsent.get(key, 0) + n
                raise
            except Exception as exc:
                log.warning("dispatch counts for the outbound rate not stored: %s", exc)

    async def rates(self) -> dict[str, float]:
        """Tasks per second dispatched to each outbound by every hub process sharing this
        state backend, over the last RATE_WINDOW seconds (by :attr:`clock`)."""
        await self._flush_rate()
        last = int(self.clock())
        counts = await self.state.dispatched_in(last - RATE_WINDOW + 1, last)
        return {name: n / RATE_WINDOW for name, n in counts.items()}

    async def rate(self, outbound: str) -> float:
        """Tasks per second dispatched to ``outbound`` by every hub process, see rates."""
        return (await self.rates()).get(outbound, 0.0)

    async def orphans(self) -> int:
        """Results that named no waiting task, counted by every hub process."""
        return sum(c.get("orphan", 0) for c in (await self.state.counters()).values())

    # ------------------------------------------------------------------ messages
    async def receive(self, inbound_name: str, messages: Iterable[Mapping[str, Any]], *,
                      wait: bool = False) -> list[dict[str, Any]]:
        """Take messages through an inbound: convert, select, then each is a result of a
        known task, a task to derive, or a new task. Returns one outcome per message."""
        inbound = self.inbound(inbound_name)
        outcomes: list[dict[str, Any]] = []
        new_tasks: list[tuple[int, dict[str, Any]]] = []
        results: list[tuple[int, str, Mapping[str, Any]]] = []
        for message in messages:
            outcome: dict[str, Any] = {}
            outcomes.append(outcome)
            data = inbound.convert(message) if isinstance(message, Mapping) else None
            if data is None:
                outcome.update(status="dropped", reason="not a JSON object, or a converter"
                               " dropped it")
                continue
            if not inbound.selectors.matches(data):
                outcome.update(status="ignored", reason=f"no selector of inbound"
                               f" {inbound.name!r} matched")
                continue
            if inbound.derive:
                new_tasks.append((len(outcomes) - 1, _derived(data)))
                continue
            uuid = data.get("task_uuid")
            if RESULT_KEY in data and uuid:
                results.append((len(outcomes) - 1, str(uuid), data))
                continue
            new_tasks.append((len(outcomes) - 1, data))
        if results:
            settled = await self._take_results([(uuid, data) for _, uuid, data in results])
            for (index, _, _), done in zip(results, settled, strict=True):
                outcomes[index].update(done)
        if new_tasks:
            submitted = await self.submit([t for _, t in new_tasks], wait=wait,
                                          frontier=inbound.frontier)
            for (index, _), result in zip(new_tasks, submitted, strict=True):
                outcomes[index].update(result.as_dict())
        return outcomes

    async def _take_result(self, uuid: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """Settle the ledger entry a result names; the outcome for the caller.

        The entry is read, judged, then settled only if it is still what was read. If a
        sweep or another process settled it meanwhile, it is read and judged again: a
        result redelivered after a crash finds either its entry or the next dispatch
        (then it is stale), never a gap.
        """
        for _ in range(SETTLE_TRIES):
            entry = await self.state.get(uuid)
            if entry is None:
                outbound = self._named_outbound(data)
                await self.state.incr(outbound, "orphan")
                self.metrics.results.labels(outbound or "unknown", "orphan").inc()
                return _orphan(uuid)
            if self._is_stale(entry, data):
                self.metrics.results.labels(entry.outbound, "stale").inc()
                return _stale(uuid)
            decision = await self.handle_result(entry, data[RESULT_KEY])
            if decision is not None:
                return {"status": decision.outcome.value, "task_uuid": uuid,
                        "reason": decision.reason}
        return {"status": "stale", "task_uuid": uuid, "reason": "its task was settled by"
                " another result or a sweep meanwhile; already handled"}

    @staticmethod
    def _is_stale(entry: LedgerEntry, data: Mapping[str, Any]) -> bool:
        """A result that names an earlier dispatch of a task (a redelivered result) must
        not be applied to the current one: results carry the ``routed_count`` they got.
        A task that already failed (its failure line is being written) takes no result."""
        if entry.failure is not None:
            return True
        if "routed_count" not in data:
            return False
        return _int(entry.task.get("routed_count")) != _int(data["routed_count"])

    def inbound(self, name: str) -> Inbound:
        """The inbound ``name``; :class:`NotFoundError` naming the configured ones."""
        try:
            return self.inbounds[name]
        except KeyError:
            raise NotFoundError(f"no inbound named {name!r}; configured:"
                                f" {', '.join(self.inbounds) or 'none'}") from None

    async def handle_result(self, entry: LedgerEntry, code: Any) -> ResultDecision | None:
        """Apply a result to a ledger entry (SPEC §1 "Results") in one atomic settle.

        The settle closes the entry (success), or replaces it by its task's next
        dispatch (retry / failback / re-route) or by the failure to log, and moves the
        counters, all at once. The follow-up (the push, the failure line) comes after,
        kept leased in the ledger until done: a process killed in between leaves it to
        the next sweep. Returns None, having done nothing, if the entry changed since it
        was read (another result or a sweep settled it first).
        Costs one settle round trip; a follow-up adds the push and one release.
        """
        decision, step = await self._plan_result(entry, code)
        if not await self.state.settle(step.current, step.after, step.counters,
                                       lease_until=step.lease_until):
            return None
        self.metrics.results.labels(entry.outbound, decision.outcome.value).inc()
        if step.after is not None:
            await self._finish(step.after)
        return decision

    async def _plan_result(self, entry: LedgerEntry, code: Any
                           ) -> tuple[ResultDecision, Settle]:
        """What a result does to ``entry``: the decision and the settle that applies it
        (a retry waits here for its target's token bucket)."""
        decision = decide_result(self.router, entry.task, entry.outbound, code)
        name = entry.outbound
        counters = [(name, SETTLED_FIELD[decision.outcome], 1)]
        if status_key(code) == TIMEOUT_STATUS:
            counters.append((name, TIMEOUT_STATUS, 1))
        after: LedgerEntry | None = None
        if decision.outcome is Outcome.FAILED:
            after = LedgerEntry(entry.task, name, None, pending="fail",
                                failure={"task_result": code, "reason": decision.reason})
        elif decision.outcome is not Outcome.SUCCESS:
            assert decision.task is not None and decision.target is not None
            target = decision.target
            await self._take_tokens(target, 1, wait=True)
            task = target.stamp(decision.task)
            now = self.clock()
            deadline = now + target.result_timeout if target.result_timeout else None
            after = LedgerEntry(dict(task), target.name, deadline, pending="push")
            counters.append((target.name, "total", 1))
        return decision, Settle(entry, after, counters, self.clock() + self.lease)

    async def _take_results(self, results: Sequence[tuple[str, Mapping[str, Any]]]
                            ) -> list[dict[str, Any]]:
        """Settle a batch of results: one ledger read and one settle round trip for the
        whole batch (SQLite: 2 transactions, Redis: 2 round trips), then the follow-ups
        (pushes of retries, failure lines) one by one. A result whose entry changed
        between the read and the settle, or a second result for a task already in the
        batch, takes the one-at-a-time path of :meth:`_take_result`."""
        entries = await self.state.get_many([uuid for uuid, _ in results])
        outcomes: list[dict[str, Any] | None] = [None] * len(results)
        planned: list[tuple[int, ResultDecision, Settle]] = []
        later: list[int] = []
        seen: set[str] = set()
        orphans: dict[str, int] = {}
        for i, (uuid, data) in enumerate(results):
            if uuid in seen:
                later.append(i)
                continue
            seen.add(uuid)
            entry = entries.get(uuid)
            if entry is None:
                outbound = self._named_outbound(data)
                orphans[outbound] = orphans.get(outbound, 0) + 1
                self.metrics.results.labels(outbound or "unknown", "orphan").inc()
                outcomes[i] = _orphan(uuid)
            elif self._is_stale(entry, data):
                self.metrics.results.labels(entry.outbound, "stale").inc()
                outcomes[i] = _stale(uuid)
            else:
                decision, step = await self._plan_result(entry, data[RESULT_KEY])
                planned.append((i, decision, step))
        if orphans:
            await self.state.incr_many([(o, "orphan", n) for o, n in orphans.items()])
        done = await self.state.settle_many([step for _, _, step in planned])
        error: BaseException | None = None
        for (i, decision, step), ok in zip(planned, done, strict=True):
            if not ok:
                later.append(i)
                continue
            self.metrics.results.labels(step.current.outbound, decision.outcome.value).inc()
            outcomes[i] = {"status": decision.outcome.value, "task_uuid": results[i][0],
                           "reason": decision.reason}
            if step.after is not None:
                try:
                    await self._finish(step.after)
                except Exception as exc:  # left leased: a sweep finishes it
                    error = error or exc
        for i in sorted(later):
            outcomes[i] = await self._take_result(*results[i])
        if error is not None:
            raise error
        return [o for o in outcomes if o is not None]

    def _named_outbound(self, data: Mapping[str, Any]) -> str:
        named = data.get("outbound")
        return named if isinstance(named, str) and named in self.router.by_name else ""

    async def _finish(self, entry: LedgerEntry) -> None:
        """Do what a settle left leased for ``entry`` (push its task's next dispatch, or
        log its failure), then release the entry: waiting for its result, or gone.

        Raises if the push fails; the entry stays leased and a sweep pushes it when the
        lease ends. A kill after the push and before the release pushes it again on
        recovery: the queue may then hold that dispatch twice, but it is one ledger
        entry, so the first result of either copy settles it and the other is stale.
        """
        if entry.pending == "fail":
            failure = entry.failure or {}
            await self.failures.append([{
                "task": entry.task, "outbound": entry.outbound,
                "task_result": failure.get("task_result"), "reason": failure.get("reason"),
            }])
            await self.state.settle(entry, None)
            return
        rule = self.router.by_name.get(entry.outbound)
        transport = self.transports.get(entry.outbound)
        if rule is None or transport is None:
            raise CrawlhubError(f"outbound {entry.outbound!r} is disabled or has no transport;"
                                f" task {entry.task.get('task_uuid')} waits in the ledger")
        [error] = await self._send([(rule, transport, [Task(entry.task)])])
        if error is not None:
            raise error
        self.metrics.dispatched.labels(rule.name).inc()
        self._note_dispatch(rule.name, 1, self.clock())
        await self.state.settle(entry, replace(entry, pending=None))

    async def sweep_lost(self, now: float | None = None) -> int:
        """Handle every dispatched task past its result_timeout as failed with
        'timeout', and finish what a process that died left leased after settling a
        result. Entries are claimed as leases (they stay in the ledger until settled):
        two processes sweeping at once handle each one once, and an entry whose handling
        fails or is killed comes back when its lease ends. Returns how many were claimed.
        """
        claimed = await self.state.claim_expired(now if now is not None else self.clock(),
                                                 lease=self.lease)
        for entry in claimed:
            uuid = entry.task.get("task_uuid")
            try:
                if entry.pending == TIMEOUT_STATUS:
                    log.warning("task %s on %s had no result within its result_timeout",
                                uuid, entry.outbound)
                    await self.handle_result(entry, TIMEOUT_STATUS)
                else:
                    log.warning("finishing the %s of task %s on %s, left unfinished (its"
                                " process stopped, or the first try failed)", entry.pending,
                                uuid, entry.outbound)
                    await self._finish(entry)
            except Exception as exc:
                log.warning("task %s on %s: %s; tried again when its lease ends", uuid,
                            entry.outbound, exc)
        return len(claimed)

    # ------------------------------------------------------------------ dry run
    async def check_task(self, inbound_name: str, message: Mapping[str, Any]) -> dict[str, Any]:
        """What the hub would do with ``message`` on ``inbound_name``; changes nothing."""
        inbound = self.inbound(inbound_name)
        report: dict[str, Any] = {"inbound": inbound.name}
        data = inbound.convert(message)
        report["converted"] = data
        if data is None:
            report.update(action="drop", reason="a converter dropped the message")
            return report
        selector = inbound.selectors.match(data)
        report["inbound_selector"] = selector.text if selector and inbound.selectors.texts \
            else None
        if selector is None:
            report.update(action="ignore",
                          reason=f"no selector of inbound {inbound.name!r} matched")
            return report
        if not inbound.derive and RESULT_KEY in data and data.get("task_uuid"):
            entry = await self.state.get(str(data["task_uuid"]))
            if entry is None:
                report.update(action="orphan_result", reason="no dispatched task with this"
                              " task_uuid is waiting for a result")
                return report
            result = decide_result(self.router, entry.task, entry.outbound, data[RESULT_KEY])
            report.update(action="result", outcome=result.outcome.value, reason=result.reason)
            if result.task is not None and result.target is not None:
                preview = result.target.stamp(Task(result.task))
                report.update(outbound=result.target.name, params=result.target.params(preview),
                              priority=preview.get("priority"))
            return report
        task = Task(_derived(data) if inbound.derive else data).ensure_identity(self.submitter)
        task.pop(RESULT_KEY, None)
        decision = self.router.route(task, explain=True)
        report["action"] = "derive" if inbound.derive else "route"
        report["candidates"] = [
            {"outbound": c.outbound, "matched": c.matched, "reason": c.reason}
            for c in decision.candidates
        ]
        if decision.outbound is None:
            report.update(outbound=None, reason=decision.reason)
            return report
        stamped = decision.outbound.stamp(Task(task))
        report.update(outbound=decision.outbound.name, selector=decision.selector,
                      reason="matched", params=decision.outbound.params(stamped),
                      priority=stamped.get("priority"))
        return report

    # ------------------------------------------------------------------ stats
    async def outbound_stats(self, prefix: str = "") -> list[dict[str, Any]]:
        counters = await self.state.counters()
        rates = await self.rates()
        rows = []
        for rule in self.router.rules:
            if not rule.name.startswith(prefix):
                continue
            c = counters.get(rule.name, {})
            # An outbound whose own backend is down is listed as unavailable, not an error
            # for the whole listing (its queue length is then unknown: None).
            left: int | None = 0
            error = ""
            try:
                left = await self.lag(rule.name) if rule.name in self.transports else 0
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                left, error = None, redact_url(f"{type(exc).__name__}: {exc}")
            rows.append({
                "name": rule.name,
                "disabled": rule.disabled,
                "available": not error,
                **({"error": error} if error else {}),
                "queue_length": left,
                "left": left,
                "total": c.get("total", 0),
                "success": c.get("success", 0),
                "failed": c.get("failed", 0),
                "retried": c.get("retried", 0),
                "rerouted": c.get("rerouted", 0),
                "failback": c.get("failback", 0),
                "timeout": c.get("timeout", 0),
                "orphan": c.get("orphan", 0),
                "rate": round(rates.get(rule.name, 0.0), 3),
            })
        return rows


def _orphan(uuid: str) -> dict[str, Any]:
    return {"status": "orphan", "task_uuid": uuid,
            "reason": "no dispatched task with this task_uuid is waiting for a result"}


def _stale(uuid: str) -> dict[str, Any]:
    return {"status": "stale", "task_uuid": uuid,
            "reason": "result of an earlier dispatch (routed_count differs); already handled"}


def _derived(data: Mapping[str, Any]) -> dict[str, Any]:
    """A result turned into a new task: its own identity, no result, fresh counters."""
    return {k: v for k, v in data.items() if k not in BUILTIN_KEY_SET and k != RESULT_KEY}


def build_source(inbound: Inbound, *, file: str | None, entry: str | None) -> InboundSource:
    name = inbound.class_name
    if name in REDIS_NAMES:
        from crawlhub.hub.inbounds.redis import RedisInbound

        kind = {"redis_list": "list", "redis_stream": "stream"}.get(name)
        init = dict(inbound.init)
        if kind:
            init.setdefault("type", kind)
        try:
            return RedisInbound(inbound.name, init, threads=inbound.threads)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, entry=entry, key="init") from exc
    if name in KAFKA_NAMES:
        try:
            from crawlhub.hub.inbounds.kafka import KafkaInbound
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise ConfigError("the kafka inbound needs the kafka extra:"
                              " pip install 'crawlhub[kafka]'", file=file, entry=entry,
                              key="class") from exc
        try:
            return KafkaInbound(inbound.name, dict(inbound.init), threads=inbound.threads)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, entry=entry, key="init") from exc
    cls = import_object(name, file=file, entry=entry, key="class")
    return cls(inbound.name, dict(inbound.init), threads=inbound.threads)  # type: ignore[no-any-return]


def _where(cfg: Any, section: str) -> tuple[str | None, str]:
    file = getattr(cfg, "source_file", None)
    index = getattr(cfg, "source_index", None)
    idx = f"[{index}]" if index is not None else ""
    return (str(file) if file else None, f"{section}{idx} {cfg.name!r}")


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0

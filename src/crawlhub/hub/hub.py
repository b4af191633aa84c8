"""The hub: takes tasks and messages in, routes them to outbounds, handles their results.

Three stages, one module each, composed by :class:`Hub` (one object: the stages share
its state, ledger and outbounds):

- intake (:mod:`crawlhub.hub.intake`): HTTP and inbound sources -> convert -> inbound
  selectors -> frontier admission -> first matching outbound -> ledger + push;
- dispatch (:mod:`crawlhub.hub.dispatch`): pushes to outbounds, token buckets, lag for
  backpressure, dispatch rates and the outbound stats;
- results (:mod:`crawlhub.hub.results`): a result settles its ledger entry atomically
  (terminal / retry / failback / re-route / failed); a ledger deadline passing is a lost
  task, handled as a failure with status ``timeout``.

Building is split from running: :func:`crawlhub.hub.plan.compile_config` checks and
compiles the config, opening nothing (``check-config`` stops there);
:meth:`Hub.from_config` builds converters, transports and sources from that plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from crawlhub.core.errors import NotFoundError
from crawlhub.core.task import BUILTIN_KEY_SET, RESULT_KEY, Task
from crawlhub.hub.converters import build_converter
from crawlhub.hub.failures import FailureLog
from crawlhub.hub.inbounds import Inbound, InboundPlan, build_source
from crawlhub.hub.inbounds.base import InboundSource
from crawlhub.hub.intake import IntakeStage, SubmitResult, extract_problem
from crawlhub.hub.metrics import HubMetrics
from crawlhub.hub.outbounds import OutboundTransport, build_transport
from crawlhub.hub.plan import (
    HubPlan,
    OutboundPlan,
    check_frontier,
    compile_config,
)
from crawlhub.hub.results import SWEEP_BATCH, ResultsStage
from crawlhub.hub.routing import Router, decide_result
from crawlhub.hub.state import CLAIM_LEASE, HubState
from crawlhub.queues.base import QueueBackend

if TYPE_CHECKING:
    from crawlhub.config.schema import CrawlhubConfig

log = logging.getLogger("crawlhub.hub")

__all__ = ["Hub", "Inbound", "SubmitResult"]


class Hub(IntakeStage, ResultsStage):
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
        self._lag_cache = {}
        self._fused_cache = {}
        self._fused_groups = {}
        #: this process, as the owner of the tasks it records (see hub/state/intake/)
        self.instance = os.urandom(8).hex()
        #: what an outage kept this process from finishing (see _leftovers)
        self._leftover = []
        self._forget = []
        #: per queue backend (id): push marks to drop with its next push
        self._forget_marks = {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Dispatch counts not yet added to the shared rate counts (see _note_dispatch).
        self._rate_unsent = {}
        self._rate_flush = None
        self._rate_lock = asyncio.Lock()
        #: The clock of every lease this hub writes (crawlhub.core.clock): intake records and
        #: heartbeats, deadlines of dispatches, ledger claims, sweeps, and of the
        #: outbound rate; tests inject one.
        self.clock = time.time
        #: Seconds a claimed lost task, or a settled result's follow-up (push, failure
        #: line), stays leased to this process before any process's sweep takes it over.
        self.lease = CLAIM_LEASE

    # ------------------------------------------------------------------ building
    @classmethod
    def from_config(
        cls,
        config: CrawlhubConfig,
        *,
        queues: QueueBackend,
        state: HubState,
        frontiers: Mapping[str, Any] | None = None,
    ) -> Hub:
        """Compile a validated :class:`CrawlhubConfig` (:func:`compile_config`: errors
        name the entry) and build a hub from it."""
        return cls.from_plan(compile_config(config), queues=queues, state=state,
                             frontiers=frontiers)

    @classmethod
    def from_plan(
        cls,
        plan: HubPlan,
        *,
        queues: QueueBackend,
        state: HubState,
        frontiers: Mapping[str, Any] | None = None,
    ) -> Hub:
        """Build a hub from a compiled plan: construct the converters, the outbound
        transports (on ``queues``) and the inbound sources. Every frontier the plan names
        must be among ``frontiers`` (checked before anything is constructed)."""
        frontiers = dict(frontiers or {})
        entries: list[OutboundPlan | InboundPlan] = [*plan.outbounds, *plan.inbounds]
        for entry in entries:
            check_frontier(entry.frontier, frontiers, file=entry.file, entry=entry.entry)
        transports = {
            ob.name: build_transport(ob.name, ob.class_name, dict(ob.init), queues=queues,
                                     priority=ob.rule.priority, file=ob.file, entry=ob.entry)
            for ob in plan.outbounds if not ob.rule.disabled
        }
        inbounds = [
            Inbound(ib, [build_converter(conv.class_name, dict(conv.init), file=ib.file,
                                         entry=ib.entry, key=conv.key)
                         for conv in ib.converters])
            for ib in plan.inbounds
        ]
        sources = {ib.name: build_source(ib) for ib in plan.inbounds
                   if not ib.disabled and not ib.is_http}
        failures = FailureLog(plan.failure_path, compress=plan.failure_compress)
        return cls(router=plan.router, inbounds=inbounds, transports=transports, state=state,
                   failures=failures, submitter=plan.submitter, frontiers=frontiers,
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

    async def take_over(self) -> None:
        """Finish at once what stopped hub processes left undone: push the tasks they
        recorded and did not push, and the follow-ups (next dispatch, failure line) of
        the results they settled. Only for a caller that knows no other hub process uses
        this state: ``crawlhub crawl`` holds its data dir's lock, so the run it resumes
        is dead, however recently it beat (otherwise the records wait for ALIVE_TTL of
        silence, the follow-ups for their leases to end, and for :meth:`start`'s loops).
        Costs a claim per 500 records, one write to end the leases, a sweep per 500."""
        now = self.clock()
        await self.recover_intake(now, everyone=True)
        if await self.state.end_leases(now):
            while await self.sweep_lost(now) >= SWEEP_BATCH:
                pass

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
            except Exception:
                log.exception("inbound %s failed; restarting it in 1 s", name)
                await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ messages
    def inbound(self, name: str) -> Inbound:
        """The inbound ``name``; :class:`NotFoundError` naming the configured ones."""
        try:
            return self.inbounds[name]
        except KeyError:
            raise NotFoundError(f"no inbound named {name!r}; configured:"
                                f" {', '.join(self.inbounds) or 'none'}") from None

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
            if not inbound.plan.selectors.matches(data):
                outcome.update(status="ignored", reason=f"no selector of inbound"
                               f" {inbound.name!r} matched")
                continue
            if inbound.plan.derive:
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
                                          frontier=inbound.plan.frontier)
            for (index, _), result in zip(new_tasks, submitted, strict=True):
                outcomes[index].update(result.as_dict())
        return outcomes

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
        selectors = inbound.plan.selectors
        selector = selectors.match(data)
        report["inbound_selector"] = selector.text if selector and selectors.texts else None
        if selector is None:
            report.update(action="ignore",
                          reason=f"no selector of inbound {inbound.name!r} matched")
            return report
        derive = inbound.plan.derive
        if not derive and RESULT_KEY in data and data.get("task_uuid"):
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
        task = Task(_derived(data) if derive else data).ensure_identity(self.submitter)
        task.pop(RESULT_KEY, None)
        problem = extract_problem(task.get("extract"))
        if problem is not None:  # submit() rejects it before routing
            report.update(action="reject", outbound=None, reason=problem)
            return report
        decision = self.router.route(task, explain=True)
        report["action"] = "derive" if derive else "route"
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


def _derived(data: Mapping[str, Any]) -> dict[str, Any]:
    """A result turned into a new task: its own identity, no result, fresh counters."""
    return {k: v for k, v in data.items() if k not in BUILTIN_KEY_SET and k != RESULT_KEY}

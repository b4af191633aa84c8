"""The hub's results stage: a result settles its task's ledger entry - terminal, retry,
failback, re-route or failed - and a task whose result never came is swept as lost.

A result settles its ledger entry atomically (terminal / retry / failback / re-route /
failed, counters with it); the follow-up (the push of the next dispatch, the failure
line) stays leased in the ledger until done, so a process killed in between loses
nothing. A ledger deadline passing is a lost task, claimed as a lease and handled as a
failure with status ``timeout``. Costs: one ledger read and one settle round trip per
batch of results (:meth:`ResultsStage._take_results`), then a push and a release per
follow-up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from crawlhub.core.errors import CrawlhubError
from crawlhub.core.task import RESULT_KEY, Task
from crawlhub.hub.dispatch import DispatchStage, _int
from crawlhub.hub.failures import FailureLog
from crawlhub.hub.routing import ResultDecision, ResultOutcome, decide_result, status_key
from crawlhub.hub.state import LedgerEntry, Settle

log = logging.getLogger("crawlhub.hub")

#: Timeout status given to a dispatched task whose result never came.
TIMEOUT_STATUS = "timeout"
#: Counter a settled result moves on its outbound, by outcome.
SETTLED_FIELD = {ResultOutcome.SUCCESS: "success", ResultOutcome.FAILED: "failed",
                 ResultOutcome.RETRY: "retried", ResultOutcome.FAILBACK: "failback",
                 ResultOutcome.REROUTE: "rerouted"}
#: Entries one sweep claims at most.
SWEEP_BATCH = 500
#: Times a result is judged again when its entry changed under it before giving up.
SETTLE_TRIES = 3


class ResultsStage(DispatchStage):
    """Settles results and sweeps lost tasks (see the module docstring);
    :class:`crawlhub.hub.hub.Hub` sets the attributes."""

    failures: FailureLog
    #: seconds a claimed entry, or a settle's follow-up, stays leased to this process
    lease: float
    _stop: asyncio.Event

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

    def _named_outbound(self, data: Mapping[str, Any]) -> str:
        named = data.get("outbound")
        return named if isinstance(named, str) and named in self.router.by_name else ""

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
        if decision.outcome is ResultOutcome.FAILED:
            after = LedgerEntry(entry.task, name, None, pending="fail",
                                failure={"task_result": code, "reason": decision.reason})
        elif decision.outcome is not ResultOutcome.SUCCESS:
            assert decision.task is not None and decision.target is not None
            target = decision.target
            await self._take_tokens(target, 1, wait=True)
            task = target.stamp(decision.task)
            now = self.clock()
            deadline = now + target.result_timeout if target.result_timeout else None
            after = LedgerEntry(dict(task), target.name, deadline, pending="push")
            counters.append((target.name, "total", 1))
        return decision, Settle(entry, after, counters, self.clock() + self.lease)

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
        self.metrics.dispatched_to(rule.name).inc()
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
                                                 SWEEP_BATCH, lease=self.lease)
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

    async def _sweep_forever(self) -> None:
        timeouts = [r.result_timeout for r in self.router.rules if r.result_timeout]
        interval = max(0.05, min(1.0, min(timeouts) / 4)) if timeouts else 1.0
        while not self._stop.is_set():
            try:
                await self.sweep_lost()
            except Exception:
                log.exception("lost-task sweep failed")
            await asyncio.sleep(interval)

    async def orphans(self) -> int:
        """Results that named no waiting task, counted by every hub process."""
        return sum(c.get("orphan", 0) for c in (await self.state.counters()).values())


def _orphan(uuid: str) -> dict[str, Any]:
    return {"status": "orphan", "task_uuid": uuid,
            "reason": "no dispatched task with this task_uuid is waiting for a result"}


def _stale(uuid: str) -> dict[str, Any]:
    return {"status": "stale", "task_uuid": uuid,
            "reason": "result of an earlier dispatch (routed_count differs); already handled"}

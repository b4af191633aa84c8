"""The hub's dispatch stage: pushing routed tasks to their outbounds, and what that costs
and counts - token buckets, the outbound lag that backpressure reads, dispatch rates.

Cost of :meth:`DispatchStage._send`, the one push of every path (intake, the follow-up
of a settled result, recovery): one ``push_multi`` round trip per queue backend (every
queue outbound on it, together) plus one ``send`` per other transport (``redis_list``,
user classes), all concurrently; so a batch costs one round trip of wall time whatever
its outbounds. Counting a dispatch costs no round trip: counts gather in the process and
go to the state backend in one write in the background (:meth:`_note_dispatch`). A lag
read is cached for :data:`LAG_TTL` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from crawlhub.backends.errors import is_unavailable
from crawlhub.core.redact import redact_url
from crawlhub.core.task import Task
from crawlhub.hub.metrics import HubMetrics
from crawlhub.hub.outbounds import OutboundTransport, QueueOutbound
from crawlhub.hub.routing import OutboundRule, Router
from crawlhub.hub.state import HubState
from crawlhub.queues.base import QueueBackend

log = logging.getLogger("crawlhub.hub")

#: How long a cached outbound lag is trusted before asking the backend again.
LAG_TTL = 0.2
#: The outbound rate is tasks dispatched over this many seconds, divided by it.
RATE_WINDOW = 10
#: Longest a dispatch count waits in one process before going to the shared counts.
RATE_FLUSH = 0.2


class DispatchStage:
    """Pushes to outbounds and counts what was pushed; the base of the hub's intake and
    results stages (both push). :class:`crawlhub.hub.hub.Hub` sets the attributes."""

    router: Router
    transports: dict[str, OutboundTransport]
    state: HubState
    metrics: HubMetrics
    clock: Callable[[], float]
    _lag_cache: dict[str, tuple[float, int]]
    #: per queue backend (id): push marks to drop with its next push
    _forget_marks: dict[int, list[str]]
    _rate_unsent: dict[tuple[str, int], int]
    _rate_flush: asyncio.Task[None] | None
    _rate_lock: asyncio.Lock

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


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0

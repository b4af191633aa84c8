"""The hub's intake stage: accepting new tasks - validate, dedupe (frontier gates),
route, then record, admit, push and mark pushed, losing nothing.

Intake (``submit``) loses nothing and, where one store holds both, doubles nothing
(the ledger side is :mod:`crawlhub.hub.state.intake`):

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
if the frontier admitted its URL for it; ``Hub.take_over`` pushes them at once for a
caller that knows the process is dead (``crawlhub crawl``: its data dir's lock). Meanwhile a retry is answered
``already_routed`` / ``duplicate``: the task will be pushed.

Cost per batch: 3 round trips (record, push, mark pushed), 4 with a frontier (+ admit).
When the ledger and the queue outbounds share one Redis server, an ungated batch is
recorded and pushed by one Lua script (1 round trip) and a gated one is recorded,
admitted, then pushed and marked pushed by one script (3). Tasks that came without a
``task_uuid`` (this process drew theirs: no ledger holds them, nothing to look up) go
as plain commands in one ``MULTI``/``EXEC`` instead, with queue ids drawn ahead
(hub/state/intake/ids.py): as atomic, about half the server's work. A kill after a
push and before its mark cannot push a task twice there, nor on a SQLite queue, whose
push stores the task uuids as marks in the same transaction (recovery asks it first; the
marks go with a later push). Only a ``redis_list`` outbound, or queues on another Redis
than the ledger, are at least once in that window.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crawlhub.backends.errors import is_unavailable, unavailable
from crawlhub.core import jsoncodec
from crawlhub.core.errors import (
    BackpressureError,
    ConfigError,
    CrawlhubError,
    FrontierError,
    QueueError,
)
from crawlhub.core.jsoncodec import TooDeepError
from crawlhub.core.keys import DEFAULT_PREFIX, queue_keys, queue_registry
from crawlhub.core.redact import redact_url
from crawlhub.core.task import BUILTIN_KEYS, RESULT_KEY, Task
from crawlhub.frontier.store import Entry
from crawlhub.hub.dispatch import DispatchStage, _int
from crawlhub.hub.outbounds import QueueOutbound
from crawlhub.hub.routing import OutboundRule
from crawlhub.hub.state.intake import (
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
from crawlhub.queues.common import PRIORITY_MAX, PRIORITY_MIN, encode_item

if TYPE_CHECKING:
    from crawlhub.agents.extract import RuleSets
    from crawlhub.frontier.manager import Frontier

log = logging.getLogger("crawlhub.hub")

#: A hub process silent (no heartbeat) this many seconds is dead: the tasks it recorded
#: and did not mark pushed are pushed by the recovery of another (or its restart).
ALIVE_TTL = 3.0
#: Seconds between heartbeats, and between recovery passes, of every hub process.
BEAT_EVERY = 0.5
RECOVER_EVERY = 1.0
#: Tasks per script of the one-script push (a batch goes as several, overlapped).
FUSED_CHUNK = 50
#: Tasks a plain batch is routed and sent in at a time, and the smaller chunks it ends
#: with, last one last (see :func:`stream_chunks`); a batch of at most STREAM_MIN tasks
#: goes whole.
STREAM_CHUNK = 50
STREAM_TAIL = (35, 15)
STREAM_MIN = 34


def stream_chunks(n: int) -> list[int]:
    """The sizes of the chunks a plain batch of ``n`` tasks is streamed in (see
    ``IntakeStage._stream``): STREAM_CHUNK each, ending with STREAM_TAIL's smaller ones
    (none under the last's size). Redis pushes each chunk while Python routes and
    encodes the next, faster than Python does, so what the batch waits for at its end is
    the push of its last chunk: a small one. A batch of 100 goes as 50, 35 and 15:
    3-7% more tasks/s than as 34, 34 and 32, batches of each plan alternating."""
    if n <= STREAM_MIN:
        return [n]
    least = STREAM_TAIL[-1]
    sizes: list[int] = []  # from the end
    left = n
    for size in reversed(STREAM_TAIL):
        if left - size < least:
            break
        sizes.append(size)
        left -= size
    while left > STREAM_CHUNK:
        sizes.append(STREAM_CHUNK)
        left -= STREAM_CHUNK
    if left < least and sizes:  # (too small to go alone: with the chunk after it)
        merged = sizes.pop() + left
        if merged > STREAM_CHUNK:  # (in two, each at most STREAM_CHUNK: one push each)
            sizes.append(merged - merged // 2)
            merged //= 2
        sizes.append(merged)
    elif left:
        sizes.append(left)
    return sizes[::-1]


def _builtins_last(task: Task) -> bool:
    """Move every built-in key of ``task`` to its end, in BUILTIN_KEYS's order, so the
    task reads as the params of an outbound that sends the whole task
    (``OutboundRule.params``): True, or False when one is missing (its params then hold
    it as null: the task is not them). The task of a plain intake holds them all
    (``ensure_identity`` and ``stamp``); moving them costs no copy of the task."""
    pop = task.pop
    try:
        for key in BUILTIN_KEYS:
            task[key] = pop(key)
    except KeyError:
        return False
    return True


#: Records of dead processes one recovery step claims at most.
CLAIM_BATCH = 500
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
    #: the task is known to hold no NaN or infinity (see ``submit``)
    finite: bool = False
    #: this process drew its uuid in this submit and tried no push of it before: no
    #: ledger holds it (the one-step push then needs no look at the ledger)
    fresh: bool = False


@dataclass(slots=True)
class _FusedPush:
    """One-script pushes on their way: per script sent, the positions of its tasks and
    the future of its answer; why tasks that cannot be stored were not sent (by
    position); the error that stopped the sending, if one did."""

    sent: list[tuple[list[int], asyncio.Future[list[bool]]]] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    error: BaseException | None = None


@dataclass(slots=True)
class _Sending:
    """A chunk of a batch between :meth:`IntakeStage._intake_send` and ``_intake_done``."""

    now: float
    gates: dict[int, tuple[str, Entry]]
    fused: list[_Todo]
    rest: list[_Todo]
    fused_push: _FusedPush | None


def _same_redis(a: str, b: str) -> bool:
    """Whether two Redis URLs name the same server and database."""
    from urllib.parse import urlsplit

    def norm(url: str) -> tuple[str, str | None, int | None, str]:
        parts = urlsplit(url.replace("valkey://", "redis://", 1)
                         .replace("valkeys://", "rediss://", 1))
        host = "127.0.0.1" if parts.hostname in ("localhost", None) else parts.hostname
        return (parts.scheme, host, parts.port or 6379, parts.path.strip("/") or "0")

    return bool(a) and bool(b) and not a.startswith("sqlite") and norm(a) == norm(b)


_INLINE_RULES: RuleSets | None = None


def extract_problem(spec: Any) -> str | None:
    """Why every agent would refuse a task's inline ``extract`` rules, or None.

    Checked at intake so a client learns it at once (a 4xx), and so a pattern RE2 cannot
    run (a backreference, a lookaround) never reaches an agent. A rule set's name
    (a string) is each agent's business. Cost: one canonical JSON dump and a dict lookup
    for a set already seen (an LRU of compiled sets, as at the agent)."""
    if spec is None or isinstance(spec, str):
        return None
    global _INLINE_RULES
    if _INLINE_RULES is None:
        from crawlhub.agents.extract import RuleSets

        _INLINE_RULES = RuleSets()
    try:
        _INLINE_RULES.for_task(spec)
    except ConfigError as exc:
        return f"extract rules refused: {exc}"
    return None


class IntakeStage(DispatchStage):
    """Takes new tasks in (see the module docstring); :class:`crawlhub.hub.hub.Hub` sets
    the attributes."""

    submitter: str
    frontiers: dict[str, Frontier]
    #: this process, as the owner of the tasks it records (see hub/state/intake/)
    instance: str
    #: what an outage kept this process from finishing (see _leftovers)
    _leftover: list[tuple[str, _Todo]]
    _forget: list[Intake]
    _fused_cache: dict[str, bool]
    _fused_groups: dict[str, tuple[QueueGroup, str]]
    _stop: asyncio.Event

    async def submit(self, tasks: Sequence[Mapping[str, Any]], *, wait: bool = False,
                     frontier: str | None = None, checked: bool = False
                     ) -> list[SubmitResult]:
        """Route new tasks (see "Intake" in the module docstring). Without ``wait``, an
        outbound over ``max_lag`` raises :class:`BackpressureError` before anything is
        written, tasks whose token scope is exhausted come back ``deferred``, and tasks
        whose push failed come back ``unavailable`` (when no task at all was pushed, the
        first such error is raised instead: :class:`BackendUnavailable` for an outage).
        With ``wait`` (inbound sources) all three are waited out.

        A task nested more than MAX_DEPTH levels raises :class:`TooDeepError` before
        anything is written; one holding a NaN or an infinity is refused alone where it
        is stored. ``checked``: the caller has seen to both already (the HTTP API: its
        parser refuses those numbers, :func:`crawlhub.api.deps.objects` the depth), so
        the tasks are not walked again."""
        results: list[SubmitResult] = [SubmitResult() for _ in tasks]
        prepared = [Task(raw) for raw in tasks]
        finite: list[bool] | None = None
        if not checked:
            # One pass over the whole batch before anything is written: a task too deep
            # refuses the batch; one holding a NaN is refused alone (``_plan``). The
            # entries of the tasks routed need no second walk.
            finite = []
            for task in prepared:
                deep, ok = jsoncodec.json_shape(task)
                if deep:
                    raise TooDeepError("the task")
                finite.append(ok)
        plans, failed = await self._stream(prepared, finite, results, frontier, wait=wait)
        while failed:
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
            failed = await self._intake(plans, results, frontier, wait=wait)
        if not failed:
            return results
        error = next(iter(failed.values()))
        if wait or not any(results[i].status in ("routed", "already_routed")
                           for i, _, _ in plans):
            # (an inbound source gets the batch again: its tasks that carry a task_uuid
            # and were pushed are answered already_routed then)
            raise unavailable(error) if is_unavailable(error) else error
        return results

    async def _stream(self, prepared: Sequence[Task], finite: Sequence[bool] | None,
                      results: list[SubmitResult], frontier: str | None, *, wait: bool
                      ) -> tuple[list[tuple[int, Task, OutboundRule]], dict[int, BaseException]]:
        """Route the batch and take it in: its plans, and the errors of the tasks whose
        push failed (by index).

        A plain batch goes in chunks (:func:`stream_chunks`): each chunk is routed and
        its push sent before the next is routed, so Redis pushes one chunk while Python
        routes the next. Plain: every enabled outbound is a queue on the ledger's Redis
        (the one-script push) with no ``max_lag``, frontier or token scope, and no inbound
        frontier. Any other batch is routed whole first, as one chunk: backpressure
        refuses it before anything is written, a frontier sees its repeats together, and
        the general path's three round trips are paid once."""
        n = len(prepared)
        plain = frontier is None and self._plain()
        sizes = (stream_chunks(n) if plain else [n]) if n else []
        plans: list[tuple[int, Task, OutboundRule]] = []
        sending: list[_Sending] = []
        failed: dict[int, BaseException] = {}
        drawn: set[int] = set()
        # the tasks the chunks' one-script pushes pushed: counted once for the batch
        # (metrics, rates), not once per chunk
        pushed: list[_Todo] = []
        try:
            start = 0
            for size in sizes:
                part = self._plan(prepared, finite, results, start, start + size, drawn)
                start += size
                plans += part
                if size == n:
                    # Backpressure first: a task refused here must not have been admitted.
                    await self._check_lag(part, wait=wait)
                sending.append(await self._intake_send(part, results, frontier, wait=wait,
                                                       drawn=drawn, plain=plain))
        except BaseException:
            # the chunks sent answer first (their tasks stand), then the error goes on
            for sent in sending:
                with suppress(Exception):
                    await self._intake_done(sent, results, pushed)
            self._dispatched(pushed, self.clock())
            raise
        try:
            for sent in sending:
                failed.update(await self._intake_done(sent, results, pushed))
        finally:
            self._dispatched(pushed, self.clock())
        return plans, failed

    def _rejected(self, result: SubmitResult, reason: str) -> None:
        result.status, result.reason = "rejected", reason
        self.metrics.rejected.inc()

    def _plain(self) -> bool:
        """Whether every enabled outbound takes a batch streamed (see :meth:`_stream`)."""
        return all(self._fused(r.name) and r.max_lag <= 0 and not r.frontier
                   and not r.token_scope for r in self.router.rules if not r.disabled)

    def _plan(self, prepared: Sequence[Task], finite: Sequence[bool] | None,
              results: list[SubmitResult], start: int, stop: int, drawn: set[int]
              ) -> list[tuple[int, Task, OutboundRule]]:
        """Give ``prepared[start:stop]`` their identity and outbound; a task no outbound
        takes, or that cannot be stored, is answered ``rejected`` here. Adds to ``drawn``
        the index of each task that came without a uuid (it gets a new one)."""
        plans: list[tuple[int, Task, OutboundRule]] = []
        first = self.router.first
        submitter = self.submitter
        for i in range(start, stop):
            task = prepared[i]
            if not task.get("task_uuid"):
                drawn.add(i)
            task.ensure_identity(submitter, checked=True)
            task.pop(RESULT_KEY, None)
            result = results[i]
            result.task_uuid = task["task_uuid"]  # (a str, ensure_identity saw to it)
            if finite is not None and not finite[i]:
                # refused alone on every backend, never stored as null
                self._rejected(result, "cannot be stored: NaN and Infinity are not JSON;"
                                       " send null or a number instead")
                continue
            if "extract" in task:
                problem = extract_problem(task["extract"])
                if problem is not None:
                    self._rejected(result, problem)
                    continue
            rule = first(task)
            if rule is None:
                self._rejected(result, self.router.route(task).reason)
                continue
            plans.append((i, task, rule))
        return plans

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

    async def _intake(self, plans: Sequence[tuple[int, Task, OutboundRule]],
                      results: list[SubmitResult], inbound_frontier: str | None, *,
                      wait: bool) -> dict[int, BaseException]:
        """Gate, take tokens, record, admit, push, mark pushed. Fills ``results``;
        returns the errors of the tasks whose push failed (by index). Every task here
        holds no NaN or infinity (``submit`` refused those): their entries are encoded
        without a second look."""
        return await self._intake_done(
            await self._intake_send(plans, results, inbound_frontier, wait=wait), results)

    async def _intake_send(self, plans: Sequence[tuple[int, Task, OutboundRule]],
                           results: list[SubmitResult], inbound_frontier: str | None, *,
                           wait: bool, drawn: Container[int] = (), plain: bool = False
                           ) -> _Sending:
        """:meth:`_intake` up to the one-script pushes sent (see :meth:`_intake_done`).
        ``drawn``: the indexes of tasks whose uuids were drawn for this first try.
        ``plain``: every outbound is fused, none gated (see :meth:`_stream`)."""
        now = self.clock()
        gates = {} if plain else self._gates(plans, results, inbound_frontier, now)
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
            allowed = (await self._take_tokens(rule, len(members), wait=wait)
                       if rule.token_per_second and rule.token_scope else len(members))
            for i, _ in members[allowed:]:
                results[i].status = "deferred"
                results[i].reason = (f"token scope {rule.token_scope!r} allows"
                                     f" {rule.token_per_second}/s; retry later")
            deadline = now + rule.result_timeout if rule.result_timeout else None
            for i, task in members[:allowed]:
                gate = gates.get(i)
                todo.append(_Todo(i, rule.stamp(task), rule, Intake(
                    task, name, deadline, gate_of(gate[0], gate[1].segment, gate[1].key)
                    if gate else None), finite=True, fresh=i in drawn))
        # Ungated tasks for queues on the ledger's own Redis: record and push, one script.
        fused: list[_Todo] = todo if plain else []
        rest: list[_Todo] = []
        for t in () if plain else todo:
            if t.intake.gate is None and self._fused(t.rule.name):
                fused.append(t)  # (its entry is encoded, or refused, with its push)
                continue
            try:  # the general path's entry, encoded once here: a task no store can hold
                t.intake.raw = t.intake.dumpb_strict(finite=t.finite)
            except (ValueError, TypeError) as exc:  # (a lone surrogate) is refused alone
                self._rejected(results[t.index], f"cannot be stored: {exc}")
                continue
            rest.append(t)
        return _Sending(now, gates, fused, rest,
                        await self._send_fused("new", fused, now) if fused else None)

    async def _intake_done(self, sending: _Sending, results: list[SubmitResult],
                           pushed_out: list[_Todo] | None = None
                           ) -> dict[int, BaseException]:
        """Wait for the one-script pushes :meth:`_intake_send` sent, answer their tasks,
        then take the rest in by the general path. Returns the errors of the tasks whose
        push failed (by index). ``pushed_out``: where the tasks those pushes pushed go,
        for the caller to count (:meth:`_dispatched`); without it they are counted here."""
        failed: dict[int, BaseException] = {}
        if sending.fused_push is not None:
            error: BaseException | None = None
            try:
                pushed, refused = await self._fused_answers(sending.fused, sending.fused_push,
                                                            sending.now, pushed_out)
            except _PartlyPushed as partly:
                error, pushed, refused = partly.error, partly.pushed, partly.refused
            for k, (t, ok) in enumerate(zip(sending.fused, pushed, strict=True)):
                if ok:
                    results[t.index].outbound = t.rule.name
                elif k in refused:
                    self._rejected(results[t.index], refused[k])
                elif error is not None:
                    # (a chunk that failed, or whose answer was lost: not recorded, or
                    # recorded and pushed - then a retry of it is already_routed)
                    self._unavailable(results[t.index], error)
                    failed[t.index] = error
                else:
                    self._already_routed(results[t.index])
        if sending.rest:
            failed.update(await self._record_and_push(sending.rest, sending.gates, results,
                                                      sending.now))
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
                        self._rejected(results[i], f"frontier {name!r}: {exc}")
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
        was pushed, and why (by position) those that cannot be stored were not."""
        return await self._fused_answers(todo, await self._send_fused(mode, todo, now), now)

    async def _send_fused(self, mode: str, todo: Sequence[_Todo], now: float) -> _FusedPush:
        """:meth:`_push_fused` up to its scripts sent. A long batch goes as scripts of
        FUSED_CHUNK tasks: each is sent before the next is encoded, so Redis runs one
        while Python prepares the next. A chunk that cannot be sent stops the sending
        (its error is kept for :meth:`_fused_answers`)."""
        state: Any = self.state
        push = _FusedPush()
        for start in range(0, len(todo), FUSED_CHUNK):
            part = range(start, min(start + FUSED_CHUNK, len(todo)))
            items, groups, registry, positions = self._fused_items(mode, todo, part,
                                                                   push.refused)
            if not items:
                continue
            fresh = mode == "new" and all(todo[k].fresh for k in positions)
            try:
                push.sent.append((positions, await state.intake_push_sent(
                    mode, items, groups, registry, now, fresh=fresh)))
            except Exception as exc:
                push.error = exc
                break
        return push

    async def _fused_answers(self, todo: Sequence[_Todo], push: _FusedPush, now: float,
                             pushed_out: list[_Todo] | None = None
                             ) -> tuple[list[bool], dict[int, str]]:
        """The answers of the scripts :meth:`_send_fused` sent: per task whether it was
        pushed, and why those that cannot be stored were not. A chunk that failed raises
        :class:`_PartlyPushed` once every chunk sent has answered (the others' tasks
        stand)."""
        pushed = [False] * len(todo)
        error = push.error
        for positions, reply in push.sent:
            try:
                flags = await reply
            except Exception as exc:
                error = error or exc
                continue
            for k, ok in zip(positions, flags, strict=True):
                pushed[k] = ok
        done = [t for t, ok in zip(todo, pushed, strict=True) if ok]
        if pushed_out is None:
            self._dispatched(done, now)
        else:
            pushed_out += done
        if error is not None:
            raise _PartlyPushed(error, pushed, push.refused)
        return pushed, push.refused

    def _fused_items(self, mode: str, todo: Sequence[_Todo], part: Iterable[int],
                     refused: dict[int, str]
                     ) -> tuple[list[tuple[Intake, int, bytes | str, int]], list[QueueGroup],
                                str, list[int]]:
        """Encode the tasks ``todo[part]`` for the one-script push: the items, the queue
        groups they go to, the queue registry key and their positions in ``todo``.
        Cost per task: its params, one or two orjson dumps (entry, payload)."""
        index: dict[str, int] = {}
        groups: list[QueueGroup] = []
        items: list[tuple[Intake, int, bytes | str, int]] = []
        positions: list[int] = []
        registry = ""
        for k in part:
            t = todo[k]
            name = t.rule.name
            g = index.get(name)
            if g is None:
                group, registry = self._fused_group(name)
                g = index[name] = len(groups)
                groups.append(group)
            priority = t.task.get("priority")
            if type(priority) is not int:
                priority = _int(priority)
            try:
                if mode == "new":
                    # The entry holds the whole task: checked strictly (no NaN) once, its
                    # params are encoded as they are (checked through the entry).
                    rule = t.rule
                    if t.finite and rule.task_params is None and not rule.static_params \
                            and not rule.task_params_wrapped and _builtins_last(t.task):
                        # params are the task itself (every key, the built-in ones last,
                        # in their order): its entry holds them as encoded once
                        encoded = jsoncodec.dumpb(t.task)
                        t.intake.raw = t.intake.entry_around(encoded)
                    else:
                        params = rule.params(t.task)
                        t.intake.raw = t.intake.dumpb_strict(finite=t.finite)
                        encoded = jsoncodec.dumpb(params)
                    payload: bytes | str = encoded
                    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
                        raise QueueError(f"priority must be an int in [{PRIORITY_MIN},"
                                         f" {PRIORITY_MAX}], got {priority}")
                else:
                    payload, priority = encode_item((t.rule.params(t.task), priority),
                                                    len(items), groups[g].queue)
            except (ValueError, TypeError, QueueError) as exc:
                refused[k] = f"cannot be stored: {exc}"
                continue
            items.append((t.intake, g, payload, priority))
            positions.append(k)
        return items, groups, registry, positions

    def _fused_group(self, outbound: str) -> tuple[QueueGroup, str]:
        """The queue group of a fused outbound and its queue registry key (built once:
        the key names are fixed for the hub's life)."""
        cached = self._fused_groups.get(outbound)
        if cached is None:
            transport = self.transports[outbound]
            assert isinstance(transport, QueueOutbound)
            queue = transport.queue
            prefix = getattr(transport.backend, "prefix", DEFAULT_PREFIX)
            keys = queue_keys(prefix, queue.name)
            cached = self._fused_groups[outbound] = (
                QueueGroup([keys[k] for k in ("ready", "payloads", "priorities", "stats",
                                              "seq")],
                           queue.name, outbound, int(getattr(queue, "limit", 0) or 0)),
                queue_registry(prefix))
        return cached

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
            self.metrics.dispatched_to(name).inc(n)
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

    # ------------------------------------------------------------------ recovery
    async def recover_intake(self, now: float | None = None, *, everyone: bool = False
                             ) -> int:
        """Push the tasks a hub process recorded and did not mark pushed before it died
        (silent for :data:`ALIVE_TTL`); a gated one only if its URL was admitted for it
        (or its gate inherited). Also finishes what this process left to do after a
        backend outage. Returns how many were pushed.

        ``everyone``: every other process is known dead (``crawlhub crawl`` holds its data
        dir's lock), so all their records are pushed now, however recently they beat."""
        now = self.clock() if now is None else now
        await self._leftovers(now)
        pushed = 0
        while True:
            claimed = await self.state.intake_claim(now, now if everyone else now - ALIVE_TTL,
                                                    self.instance, limit=CLAIM_BATCH)
            pushed += await self._recover_claimed(claimed, now)
            if not everyone or len(claimed) < CLAIM_BATCH:
                return pushed

    async def _recover_claimed(self, claimed: Sequence[Intake], now: float) -> int:
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
            except Exception as exc:
                log.warning("intake heartbeat failed (%s); trying again", exc)
            await asyncio.sleep(BEAT_EVERY)

    async def _recover_forever(self) -> None:
        while not self._stop.is_set():
            try:
                await self.recover_intake()
            except Exception:
                log.exception("intake recovery failed; trying again in %s s", RECOVER_EVERY)
            await asyncio.sleep(RECOVER_EVERY)

"""The download center: allocates agents to jobs and routes every download request.

Seed 001's allocation logic, with its corrections:

1. Agents register once (channel ``register``, always processed, however old) and beat
   separately (channel ``beats``, read by every center). A beat is a sign of life *at
   the time this center received it*, by its own clock - never the sender's stamp, which
   a forged or skewed beat could set a year ahead. The stamp only decides whether a beat
   counts: one older than ``dead_after`` is dropped (replayed after a restart), one more
   than ``max_skew`` off this clock is refused (counted in
   ``crawlhub_stream_entries_rejected_total``). Every ``sync_interval`` it merges the
   shared registry (what the other centers saw, never later than now) and the stored
   allocations into its caches.
2. ``allocate`` (synchronous for the job): the live agents are counted; ``random`` takes
   all of them (at least ``n``, default 1), ``fixed`` and ``chained`` take ``n`` at
   random. The center sends ``allocate`` to the chosen agents only and waits for their
   acks until the job's deadline; too few live agents or missing acks refuse the job
   with both numbers, and the agents that did ack are released again. The allocation
   is stored (table ``allocations``) and cached.
3. ``download``: the job's allocation from the cache, else the store; ``random`` and
   ``fixed`` pick a live allocated agent at random; ``chained`` sends a request carrying
   agent ``m`` (found on ``m``'s page) to ``m``, answers ``skipped`` at once when ``m`` is
   dead, and picks at random when the request carries no agent. No live agent: ``failed``.
4. An agent dead for ``dead_after``: its command channel is taken back in one atomic step
   (by exactly one center) and its downloads routed again - to other agents, or answered
   ``skipped`` when chained to it - so no request stays with a dead agent.
5. A message past its ``exp`` (the job gave up or retried) is dropped, not served.
6. Several centers read ``requests`` as one consumer group: each message is served once;
   a center that dies leaves its unacked messages to another after ``claim_after`` s.
   A request served twice that way is answered twice; the job keeps the first answer.
7. A message the center cannot serve (a field of the wrong type, a registration without
   an agent) is rejected on its own - counted, logged with its id, kept in the dead
   stream, acked - and the rest of its batch is served: one bad entry never stops a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from crawlhub.agents.registry.base import AgentInfo, Heartbeat
from crawlhub.center.bus import (
    MALFORMED,
    Bus,
    BusError,
    Envelope,
    Outgoing,
    retry_forever,
    wait_until,
)
from crawlhub.center.messages import (
    ALLOCATIONS,
    BEATS,
    FAILED,
    REGISTER,
    REQUESTS,
    SKIPPED,
    STRATEGIES,
    agent_channel,
    ctl_channel,
    job_channel,
)
from crawlhub.core import rejects
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.signing import MAX_SKEW

log = logging.getLogger("crawlhub.center")

SYNC_INTERVAL = 15.0
DEAD_AFTER = 11.0
CLAIM_AFTER = 5.0
CHECK_EVERY = 1.0
#: Seconds a released allocation's tombstone is kept (so no center writes it back).
TOMBSTONE = 3600.0
#: Seconds to wait before reading again after a broker error (doubling up to 5 s).
RETRY_FIRST = 0.2


class DownloadCenter:
    """One center process (or task). ``registry``, when given, is the shared agent
    registry (``GET /agents/`` reads it; several centers merge through it); without one
    the center keeps registrations in memory only (embedded, one process).
    ``run(stop)`` serves until ``stop`` is set."""

    def __init__(self, bus: Bus, *, registry: Any | None = None, center_id: str | None = None,
                 sync_interval: float = SYNC_INTERVAL, dead_after: float = DEAD_AFTER,
                 claim_after: float = CLAIM_AFTER, check_every: float = CHECK_EVERY,
                 batch: int = 500, clock: Clock = system_clock,
                 rng: random.Random | None = None, max_skew: float = MAX_SKEW) -> None:
        self.bus = bus
        self.registry = registry
        self.center_id = center_id or f"center-{socket.gethostname()}-{os.getpid()}"
        self.sync_interval = sync_interval
        self.dead_after = dead_after
        self.claim_after = claim_after
        self.check_every = check_every
        self.batch = batch
        self.max_skew = max_skew
        self.clock = clock
        self.rng = rng or random.Random()
        #: agent id -> registration (as a dict) / last sign of life (this center's clock)
        self.infos: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, float] = {}
        self.beats: dict[str, dict[str, Any]] = {}
        #: job -> allocation record (cache of the ``allocations`` table)
        self.allocations: dict[str, dict[str, Any]] = {}
        self._waiting: dict[str, tuple[set[str], set[str], asyncio.Event]] = {}
        self._asked_register: dict[str, float] = {}
        #: when the shared registry was last merged (``allocate`` merges it first when older
        #: than a second)
        self._last_sync = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self.counters = {"dispatched": 0, "skipped": 0, "failed": 0, "stale": 0,
                         "stale_beats": 0, "rerouted": 0, "claimed": 0, "allocated": 0,
                         "refused": 0, "released": 0}

    # ------------------------------------------------------------------ liveness
    def alive(self, agent_id: str, now: float | None = None) -> bool:
        seen = self.seen.get(agent_id)
        if seen is None:
            return False
        return (self.clock() if now is None else now) - seen < self.dead_after

    def live_agents(self, now: float | None = None) -> list[str]:
        now = self.clock() if now is None else now
        return sorted(a for a in self.seen if self.alive(a, now))

    def _saw(self, agent_id: str, ts: float) -> None:
        ts = min(ts, self.clock())  # never later than now, whoever wrote it
        if ts > self.seen.get(agent_id, float("-inf")):
            self.seen[agent_id] = ts

    async def _reject(self, channel: str, env: Envelope, exc: BaseException | str,
                      reason: str = rejects.MALFORMED) -> None:
        detail = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        await self.bus.reject(channel, env, reason, detail)

    # ------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        with contextlib.suppress(BusError):
            await self.sync()
        loops = [self._requests_loop(stop), self._register_loop(stop),
                 self._beats_loop(stop), self._ctl_loop(stop), self._maintain_loop(stop)]
        tasks = [asyncio.create_task(loop) for loop in loops]
        try:
            await stop.wait()
        finally:
            await _end([*tasks, *self._tasks])
            stop.set()  # a loop that missed its cancel ends at its next turn (CenterWorker.run)

    async def _forever(self, stop: asyncio.Event, what: str, step: Any) -> None:
        """Run ``step()`` until stopped, outliving broker outages (see ``retry_forever``)."""
        await retry_forever(stop, step, logger=log, who=f"center {self.center_id}",
                            what=what, first=RETRY_FIRST)

    async def _requests_loop(self, stop: asyncio.Event) -> None:
        """Read, serve, and hand what a batch caused (and its ack) to the next read's
        trip: one pipeline per batch - the sends, the acks after them, the blocking read
        last - so the read is back at Redis without a round trip of its own between. A
        failed trip drops what it carried: the batch stays pending, unacked, and is
        claimed and served again (as after a failed send)."""
        pending = True
        out: list[Outgoing] = []
        done: list[str] = []

        async def step() -> None:
            nonlocal pending, out, done
            carried, acked = out, done
            out, done = [], []
            envs = await self.bus.read(REQUESTS, self.center_id, count=self.batch,
                                       block=1.0, pending=pending, send=carried,
                                       ack={REQUESTS: acked})
            pending = False
            if envs:
                out = await self.serve(envs)
                done = [e.id for e in envs]

        await self._forever(stop, "reading requests", step)
        if out or done:  # stopped: the last batch's sends and acks (cancelled: left pending)
            with contextlib.suppress(BusError):
                await self.bus.send_many(out, ack={REQUESTS: done})

    async def handle(self, envs: Sequence[Envelope]) -> None:
        """Serve a batch of job messages, then ack them (after what they caused was sent:
        a center killed between the two leaves them to another center to serve again)."""
        out = await self.serve(envs)
        await self.bus.send_many(out, ack={REQUESTS: [e.id for e in envs]})

    async def serve(self, envs: Sequence[Envelope]) -> list[Outgoing]:
        """Serve a batch of job messages; what they cause, to send before they are acked."""
        now = self.clock()
        out: list[Outgoing] = []
        for env in envs:
            try:
                await self._serve_one(env, out, now)
            except MALFORMED as exc:
                await self._reject(REQUESTS, env, exc)
        return out

    async def _serve_one(self, env: Envelope, out: list[Outgoing], now: float) -> None:
        h = env.header
        kind = h.get("kind")
        if kind == "download":
            await self._download(h, env.body, out, now, env.raw)
        elif kind == "allocate":
            if float(h.get("exp") or 0) <= now:
                self.counters["stale"] += 1
                return
            # checked here: a bad field found in the spawned task would reject nothing
            if int(h.get("n") or 0) < 0 or not isinstance(h.get("options") or {}, dict):
                raise ValueError("n must be a count and options a mapping")
            self._spawn(self._allocate(h))
        elif kind == "release":
            await self._release(h, out)
        elif kind == "stats":
            await self._stats(h)
        else:
            await self._reject(REQUESTS, env, f"unknown kind {kind!r}")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ downloads
    async def allocation(self, job: str) -> dict[str, Any] | None:
        record = self.allocations.get(job)
        if record is None:
            record = await self.bus.get(ALLOCATIONS, job)
            if record is None or not _sane(job, record) or record.get("released"):
                return None
            self.allocations[job] = record
        return record

    def choose(self, record: Mapping[str, Any], bound: str | None,
               now: float) -> tuple[str | None, str]:
        """The agent for one request of ``record``'s job, or ``(None, status)`` with status
        ``skipped`` (chained to a dead agent) or ``failed`` (no live agent)."""
        agents: list[str] = record.get("agents") or []
        if bound and record.get("strategy") == "chained" and bound in agents:
            if self.alive(bound, now):
                return bound, ""
            return None, SKIPPED
        live = [a for a in agents if self.alive(a, now)]
        if not live:
            return None, FAILED
        return live[0] if len(live) == 1 else self.rng.choice(live), ""

    async def _download(self, h: dict[str, Any], body: bytes, out: list[Outgoing],
                        now: float, raw: bytes = b"") -> None:
        if float(h.get("exp") or 0) <= now:
            self.counters["stale"] += 1
            return
        job = str(h.get("job") or "")
        reply_to = job_channel(job)
        record = await self.allocation(job)
        if record is None:
            self.counters["failed"] += 1
            out.append((reply_to, _answer(h, FAILED, f"job {job!r} holds no allocation"
                                                    " (released, or never allocated)"), b""))
            return
        agent, status = self.choose(record, h.get("agent"), now)
        if agent is None:
            self.counters["skipped" if status == SKIPPED else "failed"] += 1
            error = (f"agent {h.get('agent')} the request is chained to is dead"
                     if status == SKIPPED else
                     f"no live agent among the {len(record.get('agents') or [])} allocated")
            out.append((reply_to, _answer(h, status, error), b""))
            return
        self.counters["dispatched"] += 1
        out.append((agent_channel(agent), raw or h, body))  # passed on as it came

    # ------------------------------------------------------------------ allocation
    async def _allocate(self, h: dict[str, Any]) -> None:
        job = str(h.get("job") or "")
        strategy = str(h.get("strategy") or "random")
        n = int(h.get("n") or 0)
        exp = float(h.get("exp") or 0)
        reply_to = job_channel(job)

        async def refuse(error: str) -> None:
            self.counters["refused"] += 1
            await self.bus.send(reply_to, {"kind": "refused", "job": job,
                                           "token": h.get("token"), "error": error,
                                           "ts": self.clock()})

        if strategy not in STRATEGIES:
            await refuse(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
            return
        now = self.clock()
        if self.registry is not None and now - self._last_sync > 1.0:
            with contextlib.suppress(Exception):
                await self._sync_registry()
        live = self.live_agents()
        want = max(n, 1) if strategy == "random" else n
        if strategy != "random" and n < 1:
            await refuse(f"strategy {strategy} needs the number of agents (n >= 1)")
            return
        if len(live) < want:
            await refuse(f"asked for {want} agents ({strategy}), {len(live)} live")
            return
        chosen = live if strategy == "random" else self.rng.sample(live, n)
        token = uuid.uuid4().hex
        # the acks may take 80% of the job's wait: the refusal must reach it in time
        acked = await self._ask(job, token, chosen, h, now + 0.8 * max(0.0, exp - now))
        if len(acked) < want or (strategy != "random" and len(acked) < len(chosen)):
            await self._send_release(job, sorted(acked))
            await refuse(f"asked {len(chosen)} agents for {want} ({strategy}), {len(acked)}"
                         f" acknowledged before the deadline")
            return
        agents = sorted(acked) if strategy == "random" else [a for a in chosen if a in acked]
        record = {"job": job, "strategy": strategy, "n": n, "agents": agents,
                  "created": self.clock(), "center": self.center_id,
                  "options": h.get("options") or {}, "stats": {}}
        await self.bus.put(ALLOCATIONS, job, record)
        self.allocations[job] = record
        self.counters["allocated"] += 1
        await self.bus.send(reply_to, {"kind": "allocated", "job": job, "token": h.get("token"),
                                       "agents": agents, "ts": self.clock()})

    async def _ask(self, job: str, token: str, agents: Sequence[str], h: Mapping[str, Any],
                   exp: float) -> set[str]:
        """Send ``allocate`` to ``agents`` and wait for their acks until ``exp``."""
        got: set[str] = set()
        done = asyncio.Event()
        self._waiting[token] = (set(agents), got, done)
        command = {"kind": "allocate", "job": job, "token": token,
                   "reply_to": ctl_channel(self.center_id), "options": h.get("options") or {},
                   "ts": self.clock(), "exp": exp}
        try:
            await self.bus.send_many([(agent_channel(a), command, b"") for a in agents])
            await wait_until(done.wait(), max(0.0, exp - self.clock()))
        finally:
            self._waiting.pop(token, None)
        return set(got)

    async def _ctl_loop(self, stop: asyncio.Event) -> None:
        async def step() -> None:
            channel = ctl_channel(self.center_id)
            envs = await self.bus.read(channel, self.center_id, count=100, block=1.0)
            for env in envs:
                try:
                    await self._acked(env.header)
                except MALFORMED as exc:
                    await self._reject(channel, env, exc)
            if envs:
                await self.bus.ack(ctl_channel(self.center_id), [e.id for e in envs])

        try:
            await self._forever(stop, "reading agent acks", step)
        finally:
            with contextlib.suppress(Exception):
                await self.bus.delete(ctl_channel(self.center_id))

    async def _acked(self, h: dict[str, Any]) -> None:
        """An agent's answer to ``allocate``."""
        if h.get("kind") != "allocated":
            return
        agent = str(h.get("agent") or "")
        token = str(h.get("token") or "")
        if token.startswith("join:"):
            await self._joined(str(h.get("job") or ""), agent, bool(h.get("ok")))
            return
        waiter = self._waiting.get(token)
        if waiter is None or not h.get("ok"):
            if not h.get("ok"):
                log.warning("center %s: agent %s refused job %s: %s", self.center_id,
                            agent, h.get("job"), h.get("error"))
            return
        expected, got, done = waiter
        if agent in expected:
            got.add(agent)
            if got >= expected:
                done.set()

    async def _joined(self, job: str, agent: str, ok: bool) -> None:
        record = await self.allocation(job)
        if not ok or record is None or agent in record["agents"]:
            return
        record["agents"] = sorted([*record["agents"], agent])
        await self.bus.put(ALLOCATIONS, job, record)

    async def _release(self, h: Mapping[str, Any], out: list[Outgoing]) -> None:
        job = str(h.get("job") or "")
        record = await self.allocation(job)
        self.allocations.pop(job, None)
        if record is None:
            return
        # a tombstone, not a delete: a center that finds an allocation of its cache
        # missing from the store (the broker restarted empty) writes it back; one
        # released elsewhere it forgets
        await self.bus.put(ALLOCATIONS, job, {"job": job, "released": self.clock()})
        self.counters["released"] += 1
        command = {"kind": "release", "job": job, "ts": self.clock()}
        out.extend((agent_channel(a), command, b"") for a in record.get("agents") or [])

    async def _send_release(self, job: str, agents: Sequence[str]) -> None:
        command = {"kind": "release", "job": job, "ts": self.clock()}
        await self.bus.send_many([(agent_channel(a), command, b"") for a in agents])

    async def _stats(self, h: Mapping[str, Any]) -> None:
        job = str(h.get("job") or "")
        record = await self.allocation(job)
        if record is None:
            return
        record["stats"] = {k: h[k] for k in ("sent", "returned", "in_flight", "failed",
                                             "skipped", "retried", "ts") if k in h}
        await self.bus.put(ALLOCATIONS, job, record)

    # ------------------------------------------------------------------ agents
    async def _register_loop(self, stop: asyncio.Event) -> None:
        pending = True

        async def step() -> None:
            nonlocal pending
            envs = await self.bus.read(REGISTER, self.center_id, count=100, block=1.0,
                                       pending=pending)
            pending = False
            if envs:
                await self.registered(envs)

        await self._forever(stop, "reading registrations", step)

    async def registered(self, envs: Sequence[Envelope]) -> None:
        """Registrations, however old: recorded, and each agent told which of the
        allocations it holds are still current (it drops the others from its file)."""
        stored: dict[str, dict[str, Any]] | None = None  # read once per batch
        now = self.clock()
        for env in envs:
            h = env.header
            try:
                info = dict(h.get("info") or {})
                agent = str(info.get("agent_id") or "")
                if not agent:
                    await self._reject(REGISTER, env, "no info.agent_id")
                    continue
                ts = float(h.get("ts") or 0)
                parsed = AgentInfo.from_dict(info)
            except MALFORMED as exc:
                await self._reject(REGISTER, env, exc)
                continue
            if ts - now > self.max_skew:
                await self._reject(REGISTER, env, f"stamped {ts - now:.0f} s ahead of this"
                                   f" clock (max {self.max_skew:g})", rejects.SKEW)
                continue
            # a sign of life now only if it was sent lately (else it was queued while no
            # center ran: recorded, not alive)
            at = now if now - ts < self.dead_after else ts
            self.infos[agent] = info
            self._saw(agent, at)
            if self.registry is not None:
                await self.registry.register(parsed, at=at)
            if stored is None:
                stored = await self.bus.all(ALLOCATIONS)
            jobs = sorted(j for j, r in stored.items() if _sane(j, r)
                          and not r.get("released") and agent in (r.get("agents") or []))
            await self.bus.send(agent_channel(agent), {"kind": "allocations", "jobs": jobs,
                                                       "ts": self.clock()})
        await self.bus.ack(REGISTER, [e.id for e in envs])

    async def _beats_loop(self, stop: asyncio.Event) -> None:
        since = int((self.clock() - self.dead_after) * 1000)
        after = f"{max(since, 0)}-0"

        async def step() -> None:
            nonlocal after
            envs, after = await self.bus.tail(BEATS, after, count=1000, block=1.0)
            if envs:
                await self.beat(envs)

        await self._forever(stop, "reading heartbeats", step)

    async def beat(self, envs: Sequence[Envelope]) -> None:
        """Heartbeats: a sign of life at receipt (this center's clock); one stamped more
        than ``max_skew`` off is refused, one older than ``dead_after`` dropped."""
        now = self.clock()
        fresh: list[tuple[str, Heartbeat]] = []
        for env in envs:
            h = env.header
            try:
                agent = str(h.get("agent") or "")
                ts = float(h.get("ts") or 0)
                beat = dict(h.get("beat") or {})
                parsed = Heartbeat.from_dict(beat)
            except MALFORMED as exc:
                await self._reject(BEATS, env, exc)
                continue
            if agent and abs(ts - now) > self.max_skew:
                await self._reject(BEATS, env, f"stamped {ts - now:+.0f} s off this clock"
                                   f" (max {self.max_skew:g})", rejects.SKEW)
                continue
            if not agent or now - ts >= self.dead_after:
                self.counters["stale_beats"] += 1
                continue
            self._saw(agent, now)
            self.beats[agent] = beat
            fresh.append((agent, parsed))
        if not fresh:
            return
        known = (await self.registry.heartbeat_many(fresh, at=[now] * len(fresh))
                 if self.registry is not None else [False] * len(fresh))
        for (agent, _), ok in zip(fresh, known, strict=True):
            if not ok and agent not in self.infos:
                await self._ask_register(agent, now)

    async def _ask_register(self, agent: str, now: float) -> None:
        if now - self._asked_register.get(agent, 0.0) < 5.0:
            return
        self._asked_register[agent] = now
        await self.bus.send(agent_channel(agent), {"kind": "register", "ts": now})

    # ------------------------------------------------------------------ upkeep
    async def sync(self) -> None:
        """Merge the shared registry and the stored allocations into the caches: stored
        ones are taken, released ones (tombstones) forgotten (and their tombstones dropped
        after an hour), and cached ones the store lost - a broker restarted without its
        data - written back."""
        await self._sync_registry()
        now = self.clock()
        stored = await self.bus.all(ALLOCATIONS)
        lost = {j: r for j, r in self.allocations.items() if j not in stored}
        for job, record in stored.items():
            if not _sane(job, record):
                continue
            released = record.get("released")
            if released:
                self.allocations.pop(job, None)
                if now - float(released) > TOMBSTONE:
                    await self.bus.drop(ALLOCATIONS, job)
            else:
                self.allocations[job] = record
        for job, record in lost.items():
            log.warning("center %s: the store lost job %s's allocation; writing it back",
                        self.center_id, job)
            await self.bus.put(ALLOCATIONS, job, record)

    async def _sync_registry(self) -> None:
        self._last_sync = self.clock()
        if self.registry is None:
            return
        for status in await self.registry.agents():
            self.infos[status.agent_id] = status.info.as_dict()
            self._saw(status.agent_id, status.last_seen)
            if status.beat is not None:
                self.beats.setdefault(status.agent_id, status.beat.as_dict())

    async def _maintain_loop(self, stop: asyncio.Event) -> None:
        last_sync = time.monotonic()

        async def step() -> None:
            nonlocal last_sync
            await wait_until(stop.wait(), self.check_every)
            if stop.is_set():
                return
            if time.monotonic() - last_sync >= self.sync_interval:
                last_sync = time.monotonic()
                await self.sync()
                await self._grow_random()
            await self.take_back_dead()
            await self.claim_orphans()

        await self._forever(stop, "upkeep", step)

    async def take_back_dead(self) -> int:
        """Take back the commands of every dead agent holding some and route its downloads
        again; how many downloads were routed."""
        now = self.clock()
        known = set(self.seen)
        for record in self.allocations.values():
            known.update(record.get("agents") or [])
        dead = sorted(a for a in known if not self.alive(a, now))
        if not dead:
            return 0
        lengths = await self.bus.length([agent_channel(a) for a in dead])
        routed = 0
        for agent, held in zip(dead, lengths, strict=True):
            if not held:
                continue
            envs = await self.bus.take_all(agent_channel(agent))
            out: list[Outgoing] = []
            for env in envs:
                if env.header.get("kind") == "download":
                    try:
                        await self._download(env.header, env.body, out, now)
                    except MALFORMED as exc:
                        await self._reject(agent_channel(agent), env, exc)
                        continue
                    routed += 1
            if envs:
                log.warning("center %s: agent %s is dead; took back %d commands, %d downloads"
                            " routed again", self.center_id, agent, len(envs),
                            sum(1 for e in envs if e.header.get("kind") == "download"))
            await self.bus.send_many(out)
        self.counters["rerouted"] += routed
        return routed

    async def claim_orphans(self) -> int:
        """Serve the requests and registrations a dead center read and never acked."""
        envs = await self.bus.claim(REQUESTS, self.center_id, self.claim_after, self.batch)
        if envs:
            self.counters["claimed"] += len(envs)
            await self.handle(envs)
        regs = await self.bus.claim(REGISTER, self.center_id, self.claim_after)
        if regs:
            await self.registered(regs)
        return len(envs) + len(regs)

    async def _grow_random(self) -> None:
        """Live agents that joined after a ``random`` job was allocated join it."""
        now = self.clock()
        live = set(self.live_agents(now))
        out: list[Outgoing] = []
        for job, record in self.allocations.items():
            if record.get("strategy") != "random":
                continue
            for agent in sorted(live - set(record.get("agents") or [])):
                out.append((agent_channel(agent), {
                    "kind": "allocate", "job": job, "token": f"join:{job}",
                    "reply_to": ctl_channel(self.center_id),
                    "options": record.get("options") or {}, "ts": now,
                    "exp": now + self.sync_interval}, b""))
        await self.bus.send_many(out)

    # ------------------------------------------------------------------ listing
    async def jobs(self) -> list[dict[str, Any]]:
        return await center_jobs(self.bus)


def open_center_registry(config: Any, url: str) -> Any:
    """The agent registry the centers on ``url`` share: on that Redis, under the config's
    prefix (None in process: the center keeps registrations in memory)."""
    if url.startswith("memory://"):
        return None
    from crawlhub.agents.registry import open_registry

    return open_registry(url, prefix=config.storage.redis_prefix,
                         dead_after=config.center.dead_after)


async def _end(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Stop loops: every one is told (``stop``) and has one read's block to end; then
    cancelled (a blocking read cancelled inside redis-py may wait on its connection, so
    the wait is bounded either way)."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=1.5)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=2.0)


#: Bad allocation records already counted: (job, the record's start).
_insane = rejects.Once()


def _sane(job: str, record: Mapping[str, Any]) -> bool:
    """An allocation record of the shape the center writes; another one (written by
    something else) is skipped - counted and logged once - so it cannot make every
    registration or upkeep that reads the table fail."""
    agents = record.get("agents")
    released = record.get("released")
    ok = ((agents is None or (isinstance(agents, list)
                              and all(isinstance(a, str) for a in agents)))
          and (released is None or isinstance(released, int | float))
          and isinstance(record.get("stats") or {}, dict)
          and isinstance(record.get("options") or {}, dict))
    if not ok and _insane.first((job, repr(record)[:200])):
        rejects.rejected("center:allocations", job, rejects.MALFORMED,
                         "an allocation record of the wrong shape; left in place, skipped")
    return ok


def _answer(h: Mapping[str, Any], status: str, error: str) -> dict[str, Any]:
    return {"kind": "reply", "rid": h.get("rid"), "job": h.get("job"),
            "attempt": h.get("attempt"), "status": status, "error": error,
            "ts": time.time()}


async def center_jobs(bus: Bus) -> list[dict[str, Any]]:
    """The ``GET /center/jobs/`` rows: every allocated job with its strategy, agents and
    the counters its client last reported (sent, returned, in flight, failed)."""
    rows = []
    for job, record in sorted((await bus.all(ALLOCATIONS)).items()):
        if not _sane(job, record) or record.get("released"):
            continue
        stats = record.get("stats") or {}
        rows.append({"job": job, "strategy": record.get("strategy"), "n": record.get("n"),
                     "agents": record.get("agents") or [], "created": record.get("created"),
                     "center": record.get("center"),
                     "sent": int(stats.get("sent") or 0),
                     "returned": int(stats.get("returned") or 0),
                     "in_flight": int(stats.get("in_flight") or 0),
                     "failed": int(stats.get("failed") or 0),
                     "skipped": int(stats.get("skipped") or 0),
                     "retried": int(stats.get("retried") or 0),
                     "reported": stats.get("ts")})
    return rows

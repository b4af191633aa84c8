"""The AlertService: routes stored in the control DB, events queued, routed, claimed
once per interval and delivered in the background, every outcome recorded; it starts
the watcher. See the package docstring for who calls what."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from crawlhub import __version__
from crawlhub.control.alerts.deliver import Sender
from crawlhub.control.alerts.model import (
    FAILED,
    SENT,
    TEST_KIND,
    AlertEvent,
    AlertRoute,
    Delivery,
    DeliveryResult,
    RoutePatch,
    RouteSpec,
    make_spec,
    mask_url,
    run_events,
)
from crawlhub.control.alerts.render import clean, render
from crawlhub.control.alerts.settings import AlertSettings
from crawlhub.control.alerts.watch import AlertWatcher, QueueStatsFn
from crawlhub.control.secrets import SecretBox, SecretError
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.errors import ConflictError, NotFoundError

if TYPE_CHECKING:
    from crawlhub.agents.registry.base import AgentRegistry
    from crawlhub.control.db import ControlDB

log = logging.getLogger("crawlhub.control.alerts")

_ROUTE_COLUMNS = "name, kind, url, target, recipients, events, jobs, queues, enabled," \
                 " created, updated"
_DELIVERY_COLUMNS = "id, route, event, job, run, about, subject, status, attempts, answer," \
                    " error, ts"

#: A webhook answer as older versions recorded it: the status, then the target's body.
_WITH_BODY = re.compile(r"^((?:the webhook answered )?HTTP \d{3}) .*$", re.DOTALL)


def _status_only(text: str) -> str:
    """``text`` without the target's body that rows recorded before the answer was the
    status alone still hold (they must not be a way to read it now)."""
    return _WITH_BODY.sub(r"\1", text or "")


class AlertService:
    """Alert routes in the control DB, and the sending of alerts (see the package
    docstring). Open with :meth:`open`; :meth:`close` stops the watcher and gives pending
    deliveries a moment to finish."""

    def __init__(self, db: ControlDB, secrets: SecretBox,
                 settings: AlertSettings | None = None, *, clock: Clock = system_clock,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.db = db
        self.secrets = secrets
        self.settings = settings or AlertSettings()
        self.clock = clock
        self._sleep = sleep
        self._routes_table = db.table("alerts")
        self._deliveries_table = db.table("alert_deliveries")
        self._claims_table = db.table("alert_claims")
        self._queue: asyncio.Queue[AlertEvent] = asyncio.Queue(self.settings.queue_size)
        self._worker: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(max(1, self.settings.concurrency))
        self._tasks: set[asyncio.Task[None]] = set()
        self._watch_task: asyncio.Task[None] | None = None
        self._sender = Sender(self.settings)
        self._seq = itertools.count()
        self._closed = False
        #: events not sent because the same one went out within ``interval``
        self.suppressed = 0
        #: events dropped because the queue was full
        self.dropped = 0

    @classmethod
    async def open(cls, db: ControlDB, secrets: SecretBox,
                   settings: AlertSettings | None = None, *, clock: Clock = system_clock,
                   sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> AlertService:
        service = cls(db, secrets, settings, clock=clock, sleep=sleep)
        await service.create_schema()
        return service

    async def create_schema(self) -> None:
        routes, deliveries, claims = (self._routes_table, self._deliveries_table,
                                      self._claims_table)
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {routes} (name TEXT PRIMARY KEY, kind TEXT NOT NULL,"
            " url TEXT, target TEXT NOT NULL, recipients TEXT NOT NULL, events TEXT NOT NULL,"
            " jobs TEXT NOT NULL, queues TEXT NOT NULL, enabled BIGINT NOT NULL,"
            " created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {deliveries} (id TEXT PRIMARY KEY,"
            " route TEXT NOT NULL, event TEXT NOT NULL, job TEXT, run TEXT,"
            " about TEXT NOT NULL, subject TEXT NOT NULL, status TEXT NOT NULL,"
            " attempts BIGINT NOT NULL, answer TEXT NOT NULL, error TEXT NOT NULL,"
            " ts DOUBLE PRECISION NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {self.db.table('alert_deliveries_route')}"
            f" ON {deliveries} (route, id)",
            f"CREATE INDEX IF NOT EXISTS {self.db.table('alert_deliveries_job')}"
            f" ON {deliveries} (job, id)",
            f"CREATE TABLE IF NOT EXISTS {claims} (route TEXT NOT NULL, event TEXT NOT NULL,"
            " about TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL,"
            " PRIMARY KEY (route, event, about))",
        ])

    # -- routes -------------------------------------------------------------------------
    async def create(self, spec: RouteSpec) -> AlertRoute:
        """Store a new route; :class:`ConflictError` if the name is taken,
        :class:`AlertError` if its webhook host is one the policy refuses."""
        await self._check_target(spec)
        now = self.clock()
        row = self._row(spec, created=now)
        found = await self.db.fetchone(
            f"INSERT INTO {self._routes_table} ({_ROUTE_COLUMNS}) VALUES ($1, $2, $3, $4,"
            " $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (name) DO NOTHING RETURNING name",
            *row)
        if found is None:
            raise ConflictError(f"alert route {spec.name!r} exists; change it with PATCH"
                                f" /alerts/{spec.name} or remove it first")
        log.info("alert route %r added: %s to %s", spec.name, spec.kind, row[3])
        return await self.get(spec.name)

    async def get(self, name: str) -> AlertRoute:
        """The route called ``name``; :class:`NotFoundError` if there is none."""
        row = await self.db.fetchone(
            f"SELECT {_ROUTE_COLUMNS} FROM {self._routes_table} WHERE name = $1", name)
        if row is None:
            raise NotFoundError(f"no alert route {name!r}; list them with GET /alerts/")
        return self._route(row)

    async def routes(self) -> list[AlertRoute]:
        """Every route, by name."""
        rows = await self.db.fetch(
            f"SELECT {_ROUTE_COLUMNS} FROM {self._routes_table} ORDER BY name")
        return [self._route(r) for r in rows]

    async def update(self, name: str, patch: RoutePatch) -> AlertRoute:
        """Apply ``patch`` to the route called ``name``; :class:`AlertError` if the result
        is not a valid route (an email route without addresses...)."""
        route = await self.get(name)
        merged: dict[str, Any] = {
            "name": route.name, "kind": route.kind, "to": route.to, "events": route.events,
            "jobs": route.jobs, "queues": route.queues, "enabled": route.enabled,
            "url": SecretStr(route.url.reveal()) if route.url is not None else None}
        changes = patch.model_dump(exclude_unset=True)
        if changes.get("kind") and changes["kind"] != route.kind:
            merged["url"], merged["to"] = None, []
        for key, value in changes.items():
            if value is None and key in ("kind", "enabled", "events"):
                continue
            merged[key] = value if value is not None or key == "url" else []
        spec = make_spec(merged)
        if "url" in changes:
            await self._check_target(spec)
        row = self._row(spec, created=route.created)
        changed = await self.db.execute(
            f"UPDATE {self._routes_table} SET kind = $2, url = $3, target = $4,"
            " recipients = $5, events = $6, jobs = $7, queues = $8, enabled = $9,"
            " updated = $11 WHERE name = $1 AND created = $10", *row)
        if not changed:
            raise NotFoundError(f"no alert route {name!r} (removed meanwhile)")
        log.info("alert route %r changed: %s", name, ", ".join(sorted(changes)) or "nothing")
        return await self.get(name)

    async def delete(self, name: str) -> None:
        """Remove a route (its deliveries stay listed); :class:`NotFoundError` if none."""
        if not await self.db.execute(
                f"DELETE FROM {self._routes_table} WHERE name = $1", name):
            raise NotFoundError(f"no alert route {name!r}")
        await self.db.execute(f"DELETE FROM {self._claims_table} WHERE route = $1", name)
        log.info("alert route %r removed", name)

    async def _check_target(self, spec: RouteSpec) -> None:
        if spec.url is not None:
            await self.settings.targets.check(spec.url.get_secret_value(),
                                              self.settings.timeout)

    def _row(self, spec: RouteSpec, *, created: float) -> tuple[Any, ...]:
        url = spec.url.get_secret_value() if spec.url is not None else None
        token = self.secrets.encrypt(url) if url is not None else None
        target = mask_url(url) if url is not None else ", ".join(spec.to)
        return (spec.name, spec.kind, token, target, json.dumps(spec.to),
                json.dumps(spec.events), json.dumps(spec.jobs), json.dumps(spec.queues),
                1 if spec.enabled else 0, created, self.clock())

    def _route(self, row: Sequence[Any]) -> AlertRoute:
        name, kind, token, target, to, events, jobs, queues, enabled, created, updated = row
        url = None
        if token:
            try:
                url = self.secrets.decrypt(token, what=f"the webhook URL of alert route"
                                           f" {name!r}")
            except SecretError as exc:
                log.warning("%s", exc)  # listed still; sending it says why it cannot
        return AlertRoute(name=name, kind=kind, target=target, to=json.loads(to),
                          events=json.loads(events), jobs=json.loads(jobs),
                          queues=json.loads(queues), enabled=bool(enabled),
                          created=float(created), updated=float(updated), url=url)

    # -- deliveries ---------------------------------------------------------------------
    async def deliveries(self, *, route: str | None = None, job: str | None = None,
                         limit: int = 100) -> list[Delivery]:
        """The newest deliveries first, of one route and/or one job."""
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("route", route), ("job", job)):
            if value is not None:
                args.append(value)
                where.append(f"{column} = ${len(args)}")
        args.append(max(1, min(int(limit), 10_000)))
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self.db.fetch(
            f"SELECT {_DELIVERY_COLUMNS} FROM {self._deliveries_table} {clause}"
            f" ORDER BY id DESC LIMIT ${len(args)}", *args)
        return [Delivery(id=r[0], route=r[1], event=r[2], job=r[3], run=r[4], about=r[5],
                         subject=r[6], status=r[7], attempts=int(r[8]),
                         answer=_status_only(r[9]), error=_status_only(r[10]),
                         ts=float(r[11])) for r in rows]

    async def _record(self, route: str, event: AlertEvent, subject: str, status: str,
                      result: DeliveryResult | None, ts: float) -> None:
        # ids sort by time, then by this process's sequence: the newest is the largest
        did = f"{int(ts * 1000):015d}-{next(self._seq) % 10**9:09d}-{uuid.uuid4().hex[:8]}"
        await self.db.execute(
            f"INSERT INTO {self._deliveries_table} ({_DELIVERY_COLUMNS}) VALUES ($1, $2, $3,"
            " $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            did, route, event.kind, clean(event.job), clean(event.run), event.about,
            subject, status, result.attempts if result else 0,
            result.answer[:500] if result else "", result.error[:1000] if result else "", ts)
        # bounded: one index read of max_deliveries ids per delivery (alerts are rare)
        await self.db.execute(
            f"DELETE FROM {self._deliveries_table} WHERE id < (SELECT id FROM"
            f" {self._deliveries_table} ORDER BY id DESC LIMIT 1 OFFSET $1)",
            max(0, self.settings.max_deliveries - 1))

    # -- sending ------------------------------------------------------------------------
    async def notify(self, event: AlertEvent) -> bool:
        """Queue ``event`` for every route it matches and return at once: True if queued,
        False if dropped (the queue is full or the service is closed). Never raises."""
        try:
            if event.ts is None:
                event.ts = self.clock()
            if self._closed:
                log.warning("alerts: closed; %s event about %s not sent", event.kind,
                            event.about)
                return False
            if self._worker is None or self._worker.done():
                self._worker = asyncio.create_task(self._work(), name="crawlhub-alerts")
            self._queue.put_nowait(event)
            return True
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("alerts: %d events wait to be sent; %s event about %s dropped",
                        self._queue.qsize(), event.kind, event.about)
            return False
        except Exception:
            log.exception("alerts: could not queue a %s event", getattr(event, "kind", "?"))
            return False

    async def run_finished(self, spec: Any, run: Any) -> None:
        """The runner's end-of-run hook: notify what :func:`run_events` finds. Never
        raises."""
        try:
            events = run_events(spec, run)
        except Exception:
            log.exception("alerts: cannot read the end of run %s", getattr(run, "id", "?"))
            return
        for event in events:
            await self.notify(event)

    async def drain(self) -> None:
        """Wait until every queued event is routed and every delivery is recorded."""
        while True:
            await self._queue.join()
            if not self._tasks:
                return
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def test(self, name: str) -> DeliveryResult:
        """Send a test message to route ``name`` now, once (enabled or not), record it
        and return the target's answer or the error. :class:`NotFoundError` if no such
        route; a target that fails is ``ok=False``, never an exception."""
        route = await self.get(name)
        now = self.clock()
        event = AlertEvent(
            kind=TEST_KIND, subject=f"test alert of route {route.name}",
            message=f"If you can read this, alert route {route.name!r} reaches its target."
                    f" Sent by crawlhub {__version__} on {socket.gethostname()}.",
            details={"route": route.name, "events": route.events, "jobs": route.jobs},
            ts=now)
        rendered = render(event, now)
        result = await self._sender.send(route, rendered)
        await self._record(route.name, event, rendered.subject, SENT if result.ok else FAILED,
                           result, now)
        if not result.ok:
            log.warning("alert route %r: test to %s failed: %s", route.name, route.target,
                        result.error)
        return result

    async def _work(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._dispatch(event)
            except Exception:
                log.exception("alerts: could not route a %s event about %s", event.kind,
                              event.about)
            finally:
                self._queue.task_done()

    async def _dispatch(self, event: AlertEvent) -> None:
        """Claim each matching route for ``event`` and start its delivery (waiting for a
        free slot: the queue backs up, and then drops, instead of tasks piling up)."""
        rows = await self.db.fetch(
            f"SELECT {_ROUTE_COLUMNS} FROM {self._routes_table} WHERE enabled = 1"
            " ORDER BY name")
        for route in (self._route(r) for r in rows):
            if not route.matches(event):
                continue
            claim = await self._claim(route.name, event)
            if claim is None:
                self.suppressed += 1
                log.debug("alerts: %s event about %s already sent to %r within %g s",
                          event.kind, event.about, route.name, self.settings.interval)
                continue
            await self._slots.acquire()
            task = asyncio.create_task(self._deliver(route, event, claim))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _claim(self, route: str, event: AlertEvent) -> float | None:
        """The time this event is claimed for ``route`` at, or None when the same kind
        about the same thing was claimed within ``interval``: one upsert, so two
        processes cannot both win."""
        now = float(event.ts if event.ts is not None else self.clock())
        if self.settings.interval <= 0:
            return now
        row = await self.db.fetchone(
            f"INSERT INTO {self._claims_table} (route, event, about, ts) VALUES ($1, $2, $3,"
            f" $4) ON CONFLICT (route, event, about) DO UPDATE SET ts = excluded.ts"
            f" WHERE {self._claims_table}.ts <= $5 RETURNING ts",
            route, event.kind, event.about, now, now - self.settings.interval)
        return now if row is not None else None

    async def _unclaim(self, route: str, event: AlertEvent, claim: float) -> None:
        if self.settings.interval > 0:
            await self.db.execute(
                f"DELETE FROM {self._claims_table} WHERE route = $1 AND event = $2 AND"
                " about = $3 AND ts = $4", route, event.kind, event.about, claim)

    async def _deliver(self, route: AlertRoute, event: AlertEvent, claim: float) -> None:
        try:
            ts = float(event.ts if event.ts is not None else self.clock())
            rendered = render(event, ts)
            result = DeliveryResult(False, route.name)
            attempts = 1 + max(0, self.settings.retries)
            for attempt in range(attempts):
                result = await self._sender.send(route, rendered)
                result.attempts = attempt + 1
                if result.ok or attempt + 1 == attempts:
                    break
                await self._sleep(self.settings.backoff * 2 ** attempt)
            if result.ok:
                log.info("alert %s about %s sent to route %r (%s)", event.kind, event.about,
                         route.name, route.target)
            else:
                log.warning("alert %s about %s to route %r (%s) failed after %d attempts:"
                            " %s", event.kind, event.about, route.name, route.target,
                            result.attempts, result.error)
                await self._unclaim(route.name, event, claim)
            await self._record(route.name, event, rendered.subject,
                               SENT if result.ok else FAILED, result, self.clock())
        except Exception:
            log.exception("alerts: delivery of a %s event to route %r failed", event.kind,
                          route.name)

    # -- watching agents and queues -----------------------------------------------------
    def watcher(self, agents: AgentRegistry | None,
                queue_stats: QueueStatsFn | None = None, *,
                more_agents: Sequence[AgentRegistry] = ()) -> AlertWatcher:
        """A watcher whose :meth:`AlertWatcher.poll` checks once (tests drive it)."""
        registries = [r for r in (agents, *more_agents) if r is not None]
        return AlertWatcher(self, registries, queue_stats, stall_after=self.settings.stall_after,
                            clock=self.clock)

    async def watch(self, agents: AgentRegistry | None,
                    queue_stats: QueueStatsFn | None = None, *,
                    interval: float | None = None,
                    more_agents: Sequence[AgentRegistry] = ()) -> None:
        """Check agents and queues every ``interval`` seconds (``control.alert_poll``)
        until cancelled: an agent seen alive that is now dead fires ``agent_dead`` once;
        a queue with Left > 0 whose Success has not moved for ``queue_stall_after``
        seconds fires ``queue_stalled`` once, until it drains or moves again."""
        watcher = self.watcher(agents, queue_stats, more_agents=more_agents)
        period = interval if interval is not None else self.settings.poll
        while True:
            await watcher.poll()
            await asyncio.sleep(period)

    def start_watch(self, agents: AgentRegistry | None,
                    queue_stats: QueueStatsFn | None = None, *,
                    interval: float | None = None,
                    more_agents: Sequence[AgentRegistry] = ()) -> None:
        """Run :meth:`watch` in the background until :meth:`close` (once: a second call
        does nothing while the first runs)."""
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.create_task(
                self.watch(agents, queue_stats, interval=interval, more_agents=more_agents),
                name="crawlhub-alert-watch")

    async def close(self, grace: float = 5.0) -> None:
        """Stop watching, give queued deliveries ``grace`` seconds, then stop."""
        self._closed = True
        watch, self._watch_task = self._watch_task, None
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(BaseException):
                await watch
        if self._worker is not None:
            try:
                await asyncio.wait_for(self.drain(), grace)
            except Exception:
                log.warning("alerts: %d events and %d deliveries still pending at close;"
                            " not sent", self._queue.qsize(), len(self._tasks))
            for task in [self._worker, *self._tasks]:
                task.cancel()
            await asyncio.gather(self._worker, *self._tasks, return_exceptions=True)
            self._worker = None
        await self._sender.close()

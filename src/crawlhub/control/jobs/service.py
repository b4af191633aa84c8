"""Jobs as the API, the CLI and the web page see them: one model for every kind.

Jobs made through the API live in the control database; the config's collection jobs
(``jobs:``) appear beside them as kind ``collect`` (read-only here: the config owns
them). The service answers with :class:`JobView` and :class:`RunView`, the models the
API returns and the web page renders.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from crawlhub.control.jobs.cron import CronScheduler
from crawlhub.control.jobs.model import (
    LIVE,
    JobPatch,
    JobSpec,
    RunRecord,
    TaskRecord,
    check_env,
)
from crawlhub.control.jobs.runner import Runner
from crawlhub.control.jobs.store import STALE_AFTER, JobStore
from crawlhub.core import jobprotocol as protocol
from crawlhub.core.configtypes import new_list
from crawlhub.core.errors import ConflictError

if TYPE_CHECKING:
    from crawlhub.collect.service import CollectJobManager

#: Counter names read as a job's queue figures (crawlhub.sdk, crawl, collect, Scrapy).
QUEUE_COUNTERS = {
    "left": ("left", "queue_left", "pending"),
    "total": ("total", "queue_total", "requests_total", "pages_total"),
    "success": ("success", "succeeded", "pages", "pages_ok", "requests_ok",
                "response_received_count"),
    "failed": ("failed", "errors", "pages_failed", "requests_failed", "log_count/ERROR"),
    "retried": ("retried", "requests_retried", "retry/count"),
}

log = logging.getLogger("crawlhub.control.jobs")
#: Seconds between two sweeps for the runs of servers that died (crawlhub serve).
SWEEP_EVERY = 30.0


class QueueInfo(BaseModel):
    """Left, Total, Success, Failed, Retried and the success rate of a job's run."""

    run: str | None = None
    left: int | None = None
    total: int | None = None
    success: int | None = None
    failed: int | None = None
    retried: int | None = None
    #: successes per second of running time
    rate: float | None = None


class JobView(BaseModel):
    """A job with what is known of it now."""

    spec: JobSpec
    #: "api" for jobs made through the API or CLI, "config" for the config's collect jobs
    source: str = "api"
    #: the desired state on the control channel: run, pause or exit
    desired: str = protocol.RUN
    running: list[str] = Field(default_factory=new_list)
    #: the runs among ``running`` whose pause took effect (the job acknowledged it, or
    #: its processes were stopped)
    paused: list[str] = Field(default_factory=new_list)
    last_run: RunRecord | None = None
    next_fire: float | None = None


class RunView(BaseModel):
    run: RunRecord
    tasks: list[TaskRecord] = Field(default_factory=new_list)
    queue: QueueInfo | None = None


class JobService:
    """Create, change, run, pause, continue, cancel and restart jobs; read runs."""

    def __init__(self, store: JobStore, runner: Runner, *, collect: CollectJobManager | None = None,
                 clock: Callable[[], float] = time.time,
                 allowed_env: Iterable[str] = ()) -> None:
        self.store = store
        #: loader and startup-hook variables a job's env may set all the same
        #: (``control.allowed_env``; :func:`crawlhub.control.jobs.model.check_env`)
        self.allowed_env = tuple(allowed_env)
        self.runner = runner
        self.channel = runner.channel
        #: the collection-job manager (CollectJobManager) of the config's ``jobs:``, or None
        self.collect = collect
        self.clock = clock
        self.cron = CronScheduler(store, self._cron_start, clock=clock)
        self._cron_task: asyncio.Task[None] | None = None
        self._cron_stop = asyncio.Event()
        self._sweep_task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await self.store.open()
        # Runs this host started in a server that died (SIGKILL) cannot report again;
        # the job processes it left running are stopped.
        await self.store.lose_dead_runs(self.clock(), stop_orphans=self.runner.stop_orphans)

    def start_scheduler(self) -> None:
        """Cron, and the sweep of runs whose server died (every :data:`SWEEP_EVERY` s)."""
        if self._cron_task is None:
            self._cron_stop.clear()
            self._cron_task = asyncio.create_task(self.cron.run(self._cron_stop),
                                                  name="crawlhub cron")
        if self._sweep_task is None:
            self._sweep_task = asyncio.create_task(self._sweep_loop(), name="crawlhub sweep")

    async def sweep(self) -> int:
        """Runs whose server died while this one lives: on this host, the job processes
        a server killed over :data:`STALE_AFTER` s ago left running are stopped and their
        runs marked lost; on any host, runs whose runner stopped beating that long ago
        are marked lost. The runs marked."""
        now = self.clock()
        lost = await self.store.lose_dead_runs(now, stop_orphans=self.runner.stop_orphans,
                                               quiet_for=STALE_AFTER,
                                               skip=set(self.runner.live))
        return lost + await self.store.lose_stale_runs(now)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            try:
                lost = await self.sweep()
                if lost:
                    log.warning("%d run(s) of a server that died marked lost", lost)
            except Exception as exc:
                log.warning("the sweep of dead servers' runs failed: %s", exc)

    async def close(self) -> None:
        if self._sweep_task is not None:
            self._sweep_task.cancel()
            await asyncio.gather(self._sweep_task, return_exceptions=True)
            self._sweep_task = None
        if self._cron_task is not None:
            self._cron_stop.set()
            self._cron_task.cancel()
            await asyncio.gather(self._cron_task, return_exceptions=True)
            self._cron_task = None
        await self.runner.close()

    # -- the config's collection jobs -------------------------------------------------------
    def _collect_specs(self) -> dict[str, JobSpec]:
        if self.collect is None:
            return {}
        return {name: JobSpec.model_construct(
                    name=name, kind="collect", project=None, version=None, command=[],
                    args=[], cron=None, timezone="UTC", env={},
                    notes="a collection job of the config's 'jobs:'", timeout=None,
                    max_instances=1, pause_signal=False, pausable=True, grace=None,
                    enabled=job.enabled)
                for name, job in self.collect.jobs.items()}

    def _check_env(self, spec: JobSpec) -> None:
        """:class:`~crawlhub.control.jobs.model.JobEnvError` when ``spec``'s env sets a
        variable that loads code and ``control.allowed_env`` does not list it."""
        check_env(spec.env, self.allowed_env, job=f"job {spec.name!r}")

    async def spec(self, name: str) -> tuple[JobSpec, str]:
        """A job's spec and its source ("api" or "config"); NotFoundError if none."""
        config = self._collect_specs().get(name)
        if config is not None:
            return config, "config"
        return await self.store.get(name), "api"

    # -- jobs ---------------------------------------------------------------------------
    async def create(self, spec: JobSpec) -> JobView:
        if spec.name in self._collect_specs():
            raise ConflictError(f"job {spec.name!r} is a collection job of the config's"
                                " 'jobs:'; choose another name")
        if spec.kind == "collect":
            raise ConflictError("collection jobs are defined in the config's 'jobs:', not"
                                " through the API; use kind 'subprocess' or 'crawl'")
        if not spec.argv() and spec.kind == "subprocess":
            raise ConflictError(f"job {spec.name!r} has no command: give 'command' as a"
                                " list like [\"python\", \"spider.py\"]")
        self._check_env(spec)
        await self.store.create(spec, self.clock())
        return await self.get(spec.name)

    async def update(self, name: str, patch: JobPatch) -> JobView:
        spec, source = await self.spec(name)
        if source == "config":
            raise ConflictError(f"job {name!r} comes from the config's 'jobs:'; change it"
                                " there")
        changed = patch.apply(spec)
        self._check_env(changed)
        await self.store.replace(changed, self.clock())
        return await self.get(name)

    async def delete(self, name: str) -> None:
        spec, source = await self.spec(name)
        if source == "config":
            raise ConflictError(f"job {name!r} comes from the config's 'jobs:'; remove it"
                                " there")
        if await self.store.live_runs(name):
            await self.cancel(name)
        await self.store.delete(name)

    async def get(self, name: str) -> JobView:
        spec, source = await self.spec(name)
        fire = await self.store.next_fire(name) if source == "api" else None
        return (await self._views([(spec, source, fire)]))[0]

    async def _views(self, specs: list[tuple[JobSpec, str, float | None]]) -> list[JobView]:
        """The views of ``(spec, source, next cron tick)``: two statements for the runs
        of every job on the page and one for their desired states, not a few per job."""
        names = [spec.name for spec, _, _ in specs]
        live, paused, last = await self.store.summaries(names)
        if len(names) == 1:
            desired = {names[0]: await self.channel.get(names[0])}
        else:
            desired = {name: state.state for name, state in (await self.channel.states()).items()}
        views = []
        for spec, source, fire in specs:
            running = live.get(spec.name, [])
            if source == "config" and self.collect is not None and not running \
                    and self.collect.running(spec.name):
                running = ["(collect)"]
            views.append(JobView(spec=spec, source=source,
                                 desired=desired.get(spec.name, protocol.RUN),
                                 running=running, paused=paused.get(spec.name, []),
                                 last_run=last.get(spec.name),
                                 next_fire=fire))
        return views

    async def list_jobs(self, *, after: str | None = None, limit: int = 100,
                        kind: str | None = None, prefix: str | None = None
                        ) -> list[JobView]:
        """Jobs by name (the config's collection jobs among them), keyset-paged."""
        stored = await self.store.list_jobs(after=after, limit=limit, kind=kind, prefix=prefix)
        specs = [(spec, "api", fire) for spec, fire in stored]
        if kind in (None, "collect"):
            specs += [(spec, "config", None) for name, spec in self._collect_specs().items()
                      if (after is None or name > after) and (not prefix or name.startswith(prefix))]
        specs.sort(key=lambda triple: triple[0].name)
        return await self._views(specs[:limit])

    # -- acting -------------------------------------------------------------------------
    async def run(self, name: str, *, trigger: str = "api", args: list[str] | None = None,
                  env: dict[str, str] | None = None, version: str | None = None
                  ) -> RunRecord:
        """Start a run now (409 at ``max_instances``, or for a disabled job). ``args``,
        ``env`` and ``version`` change this run only: more arguments after the job's,
        more variables, another build (Scrapyd's ``schedule.json`` runs one spider with
        its settings and arguments this way)."""
        spec, _ = await self.spec(name)
        if not spec.enabled:
            raise ConflictError(f"job {name!r} is disabled; PATCH it with enabled: true")
        if args or env or version:
            spec = JobSpec.model_validate({**spec.model_dump(),
                                           "args": [*spec.args, *(args or ())],
                                           "env": {**spec.env, **(env or {})},
                                           "version": version or spec.version})
        # again here: a job stored before the check, or before the config allowed less
        self._check_env(spec)
        return await self.runner.start(spec, trigger=trigger)

    async def _cron_start(self, spec: JobSpec, tick: float) -> RunRecord:
        self._check_env(spec)  # a skipped tick
        return await self.runner.start(spec, trigger="cron", scheduled_for=tick)

    async def pause(self, name: str) -> JobView:
        """Store ``pause`` as the job's desired state: its runs hold still within a second
        (acknowledged by the job, else its processes stopped) and later runs start
        paused, until continued. A job with ``pausable: false`` is a ConflictError."""
        spec, _ = await self.spec(name)
        if not spec.pausable:
            raise ConflictError(f"job {name!r} is not pausable (pausable: false): its runs"
                                " go on; cancel them, or PATCH the job with pausable: true")
        await self.channel.set(name, protocol.PAUSE)
        return await self.get(name)

    async def resume(self, name: str) -> JobView:
        await self.spec(name)
        await self.channel.set(name, protocol.RUN)
        return await self.get(name)

    async def cancel(self, name: str, *, wait: float | None = None) -> list[str]:
        """Ask every run of ``name`` (on any host) to exit: SIGTERM, SIGKILL after the
        grace period. Waits up to ``wait`` seconds for them to end. The runs asked."""
        await self.spec(name)
        live = [run.id for run in await self.store.live_runs(name)]
        if not live and not self.runner.local_runs(name):
            return []
        await self.channel.set(name, protocol.EXIT)
        self.runner.stop_local(name)
        if wait:
            deadline = self.clock() + wait
            while self.clock() < deadline and await self.store.live_runs(name):
                await asyncio.sleep(0.1)
        return live

    async def cancel_run(self, run_id: str, *, wait: float | None = None) -> RunRecord:
        """Ask one run (on any host) to exit, the job's other runs left alone: SIGTERM,
        SIGKILL after the grace period. A run of this process is asked at once, one of
        another within a second (its runner polls). Waits up to ``wait`` seconds for it
        to end; the run as it then is. A run already over is a ConflictError."""
        run = await self.store.run(run_id)
        if run.status not in LIVE:
            raise ConflictError(f"run {run_id} is {run.status}: there is nothing to cancel")
        if run_id in self.runner.live:
            self.runner.stop_run(run_id)
        else:
            await self.store.ask_stop(run_id, self.clock())
        if wait:
            deadline = self.clock() + wait
            while self.clock() < deadline and (await self.store.run(run_id)).status in LIVE:
                await asyncio.sleep(0.1)
        return await self.store.run(run_id)

    async def restart(self, name: str) -> RunRecord:
        """Cancel the job's runs, wait for them to end, then start a new run."""
        spec, _ = await self.spec(name)
        self._check_env(spec)  # before stopping it
        await self.cancel(name, wait=self.runner.grace_of(spec) + 5)
        if await self.store.live_runs(name):
            raise ConflictError(f"job {name!r}'s runs did not end within the grace period;"
                                " try again")
        if await self.channel.get(name) == protocol.EXIT:
            await self.channel.set(name, protocol.RUN)
        return await self.runner.start(spec, trigger="restart")

    # -- runs ---------------------------------------------------------------------------
    async def runs(self, *, job: str | None = None, status: list[str] | None = None,
                   before: str | None = None, limit: int = 50) -> list[RunRecord]:
        return await self.store.list_runs(job=job, status=status or (), before=before,
                                          limit=limit)

    async def run_view(self, run_id: str) -> RunView:
        run = await self.store.run(run_id)
        return RunView(run=run, tasks=await self.store.run_tasks(run_id),
                       queue=queue_info(run, self.clock()))

    async def queue(self, name: str) -> QueueInfo:
        """The queue figures of the job's newest run (live first)."""
        await self.spec(name)
        live = await self.store.live_runs(name)
        run = live[0] if live else await self.store.last_run(name)
        return queue_info(run, self.clock()) if run else QueueInfo()


def queue_info(run: RunRecord, now: float) -> QueueInfo:
    counters = run.counters or {}

    def pick(field: str) -> int | None:
        for key in QUEUE_COUNTERS[field]:
            value = counters.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return int(value)
        return None

    info = QueueInfo(run=run.id, left=pick("left"), total=pick("total"),
                     success=pick("success"), failed=pick("failed"), retried=pick("retried"))
    if info.left is None and info.total is not None and info.success is not None:
        info.left = max(0, info.total - info.success - (info.failed or 0))
    end = run.finished_at if run.finished_at is not None else now
    elapsed = max(end - run.started_at, 1e-9)
    if info.success is not None and run.status in LIVE + ("succeeded", "failed", "cancelled",
                                                           "timeout"):
        info.rate = round(info.success / elapsed, 3)
    return info


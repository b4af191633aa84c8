"""The collection-job service: starts, stops and reports the collection jobs (the
config's ``jobs:``) of one crawlhub process.

``CollectJobManager`` runs each job as an asyncio task with its own cancellation token; jobs
with ``enabled`` and ``auto_start`` start with the server. Progress, the run lease (who
runs a job, in any process) and recent log lines live in the metadata store, so status
and stop work for runs started elsewhere (another server, ``crawlhub collect``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crawlhub.collect.config import CollectJobConfig
from crawlhub.collect.lease import DEFAULT_LEASE_TTL, JobConflict, JobRunning, is_live
from crawlhub.collect.store import Lease, SqlMetadataStore, open_metadata_store
from crawlhub.core.errors import NotFoundError
from crawlhub.fetch.cancel import CancellationToken
from crawlhub.fetch.joblog import format_line
from crawlhub.sdk import Counters

if TYPE_CHECKING:
    from crawlhub.collect.runner import JobRun
    from crawlhub.fetch.scheduler import RequestScheduler
    from crawlhub.pipeline.result import RunResult

# The runner (the fetch client, the pipeline, the sinks) is imported when a job first
# runs: serving the API imports this module for its types (start-up).

_log = logging.getLogger("crawlhub.collect")

__all__ = ["CollectJobManager", "JobConflict", "JobNotFound", "JobRunning",
           "metadata_url_for"]


class JobNotFound(NotFoundError):
    """No collection job of that name in the config (the API answers 404)."""


@dataclass
class _Active:
    run: JobRun
    task: asyncio.Task[RunResult]
    started_at: float


def metadata_url_for(config: Any) -> str:
    """``storage.metadata`` with ``{data_dir}`` filled in (default: SQLite under data_dir)."""
    storage = getattr(config, "storage", None)
    url = str(getattr(storage, "metadata", None) or "sqlite:///{data_dir}/meta.db")
    data_dir = str(getattr(config, "data_dir", None) or ".")
    return url.replace("{data_dir}", data_dir)


class CollectJobManager:
    """Collection jobs of one process: ``start``, ``stop``, ``status``, ``list``.

    Jobs sharing a scheduler setup (mode, scope, concurrency) share one scheduler, so
    with the default global serial scope their requests go one at a time in job order.
    """

    def __init__(
        self,
        config: Any,
        *,
        metadata_url: str | None = None,
        table_prefix: str = "crawlhub_collect_",
        env: Any = None,
        cli: dict[str, Any] | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
    ) -> None:
        self.config = config
        self.lease_ttl = lease_ttl
        self.jobs: dict[str, CollectJobConfig] = {job.name: job for job in config.jobs}
        self.metadata_url = metadata_url or metadata_url_for(config)
        self.table_prefix = table_prefix
        self.env = env
        self.cli = cli
        self._store: SqlMetadataStore | None = None
        self._store_lock = asyncio.Lock()
        self._active: dict[str, _Active] = {}
        self._last: dict[str, RunResult] = {}
        self._schedulers: dict[tuple[Any, ...], RequestScheduler] = {}

    # ---- lifecycle --------------------------------------------------------------------
    async def store(self) -> SqlMetadataStore:
        """The metadata store, opened on first use (tables created if missing)."""
        async with self._store_lock:
            if self._store is None:
                self._store = await open_metadata_store(self.metadata_url,
                                                        table_prefix=self.table_prefix)
            return self._store

    async def start_auto(self) -> list[str]:
        """Start every job with ``enabled`` and ``auto_start``; returns their run ids.

        A job already running elsewhere (another server, the CLI) is left to that run:
        logged, not an error, so a second server starts cleanly.
        """
        started = []
        for job in self.jobs.values():
            if job.enabled and job.auto_start and job.name not in self._active:
                try:
                    started.append(await self.start(job.name))
                except JobRunning as exc:
                    _log.warning("auto_start skipped: %s", exc)
        return started

    async def close(self) -> None:
        """Cancel running jobs gracefully (what they processed is written), close the store."""
        for active in list(self._active.values()):
            active.run.token.cancel("service shutting down")
        for active in list(self._active.values()):
            with contextlib.suppress(BaseException):
                await active.task
        if self._store is not None:
            await self._store.close()
            self._store = None

    # ---- control ----------------------------------------------------------------------
    def job(self, name: str) -> CollectJobConfig:
        job = self.jobs.get(name)
        if job is None:
            known = ", ".join(sorted(self.jobs)) or "none configured"
            raise JobNotFound(f"no job named {name!r}; known jobs: {known}")
        return job

    async def start(self, name: str, *, control: Any = None,
                    counters: Counters | None = None) -> str:
        """Start ``name`` in the background; its run id. ``JobConflict`` if it cannot.

        ``control`` (e.g. a ``ControlFollower``'s ``control``) pauses, continues or ends
        the run; ``counters`` get its requests, items and errors (see ``JobRun``)."""
        job = self.job(name)
        if not job.enabled:
            raise JobConflict(
                f"job {name!r} is disabled (enabled: false); enable it in the config to start it"
            )
        active = self._active.get(name)
        if active is not None and active.run.lease.current is not None:
            raise JobRunning(active.run.lease.current)
        if active is not None:
            raise JobConflict(f"job {name!r} is already running (run {active.run.run_id})")
        from crawlhub.collect.build import new_run

        store = await self.store()
        run = new_run(
            job,
            store=store,
            config=self.config,
            scheduler=self._scheduler(job),
            token=CancellationToken(),
            env=self.env,
            cli=self.cli,
            lease_ttl=self.lease_ttl,
            control=control,
            counters=counters,
        )
        await run.claim()  # here, so a run elsewhere is a 409 now, not later
        task = asyncio.create_task(self._run(run), name=f"job:{name}")
        self._active[name] = _Active(run=run, task=task, started_at=time.time())
        return run.run_id

    async def _run(self, run: JobRun) -> RunResult:
        try:
            result = await run.run()
            self._last[run.job.name] = result
            return result
        finally:
            self._active.pop(run.job.name, None)

    async def stop(self, name: str, *, wait: bool = True) -> bool:
        """Cancel the job's token (manual stop); False when it was not running.

        The run ends CANCELLED with everything processed written and progress saved. A run
        in another process gets the request through its lease and stops at its next
        heartbeat (within a third of the lease ttl); that one is not waited for.
        """
        self.job(name)
        active = self._active.get(name)
        if active is None:
            elsewhere = await self.elsewhere(name)
            if elsewhere is None:
                return False
            await (await self.store()).request_stop(
                name, f"stopped by request (from pid {os.getpid()} on {socket.gethostname()})"
            )
            return True
        active.run.token.cancel("stopped by request")
        if wait:
            with contextlib.suppress(BaseException):
                await active.task
        return True

    async def wait(self, name: str) -> RunResult | None:
        """Wait for the running job to finish; its result (None when it was not running)."""
        self.job(name)
        active = self._active.get(name)
        if active is None:
            return self._last.get(name)
        return await asyncio.shield(active.task)

    def running(self, name: str) -> bool:
        """Whether this process runs ``name`` now (``elsewhere`` checks other processes)."""
        return name in self._active

    async def elsewhere(self, name: str) -> Lease | None:
        """The live lease of a run of ``name`` in another process (or another manager)."""
        if name in self._active:
            return None
        lease = await (await self.store()).lease(name)
        if lease is None or not is_live(lease, time.time()):
            return None
        return lease

    # ---- status -----------------------------------------------------------------------
    async def status(self, name: str, *, log_lines: int = 200) -> dict[str, Any]:
        """State, live progress (or saved progress), last RunResult and the job's log."""
        job = self.job(name)
        store = await self.store()
        active = self._active.get(name)
        elsewhere = await self.elsewhere(name)
        saved = await store.load_progress(name)
        runs = await store.runs(name, limit=2) if active is None else []
        runs = [r for r in runs if r.result is not None]
        last: dict[str, Any] | None = None
        if name in self._last:
            last = self._last[name].to_dict()
        elif runs:
            last = runs[0].result
        # The log of the job's runs in any process, from the metadata store.
        lines = [format_line(line) for line in await store.log_lines(name, log_lines)]
        if not lines and runs:
            lines = runs[0].log[-log_lines:] if log_lines > 0 else []
        run_id = active.run.run_id if active else elsewhere.run_id if elsewhere else None
        return {
            "name": name,
            "enabled": job.enabled,
            "auto_start": job.auto_start,
            "strategy": job.strategy.type,
            "state": "running" if active or elsewhere else "idle",
            "run_id": run_id,
            "runner": _runner(active.run.lease.current if active else elsewhere),
            "progress": active.run.progress() if active else None,
            "saved": saved.to_dict() if saved else None,
            "pending_details": await store.count_detail_ids(name) if job.detail.enabled else 0,
            "last_result": last,
            "log": lines,
        }

    async def log(self, name: str, lines: int = 200) -> list[str]:
        """The newest ``lines`` log lines of ``name``, whichever process ran it."""
        self.job(name)
        store = await self.store()
        return [format_line(line) for line in await store.log_lines(name, lines)]

    async def list(self) -> list[dict[str, Any]]:
        """One short line per job: name, flags, state, run id, last status."""
        out = []
        for name, job in self.jobs.items():
            active = self._active.get(name)
            elsewhere = await self.elsewhere(name)
            last = self._last.get(name)
            run_id = active.run.run_id if active else elsewhere.run_id if elsewhere else None
            out.append(
                {
                    "name": name,
                    "enabled": job.enabled,
                    "auto_start": job.auto_start,
                    "strategy": job.strategy.type,
                    "state": "running" if active or elsewhere else "idle",
                    "run_id": run_id,
                    "runner": _runner(active.run.lease.current if active else elsewhere),
                    "last_status": last.status.value if last else None,
                }
            )
        return out

    # ---- schedulers ---------------------------------------------------------------------
    def _scheduler(self, job: CollectJobConfig) -> RequestScheduler:
        """One scheduler per (mode, scope, concurrency, bucket) setup, shared by jobs."""
        from crawlhub.collect.build import job_pipeline_config, scheduler_for

        pipeline = job_pipeline_config(
            job,
            getattr(self.config, "pipeline", None),
            env=self.env or getattr(self.config, "settings", None),
            cli=self.cli,
        )
        key = (
            pipeline.mode,
            pipeline.scope,
            pipeline.concurrency,
            pipeline.rate_per_second,
            pipeline.burst,
        )
        scheduler = self._schedulers.get(key)
        if scheduler is None:
            scheduler = self._schedulers[key] = scheduler_for(pipeline)
        return scheduler


def _runner(lease: Lease | None) -> dict[str, Any] | None:
    """Where a running job runs: pid, host, since (None when idle)."""
    if lease is None:
        return None
    return {"pid": lease.pid, "host": lease.host, "since": lease.since, "run_id": lease.run_id}


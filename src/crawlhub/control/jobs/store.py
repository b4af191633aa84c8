"""Jobs, runs and run timelines in the control database (SQLite embedded, PostgreSQL
distributed): the one place their SQL lives.

Costs: every method is one statement, but :meth:`JobStore.claim_run` (one transaction
under the job's lock: mark stale runs lost, count live runs, insert) and
:meth:`JobStore.claim_tick` (one compare-and-set, so of many schedulers exactly one fires
a cron tick). Listing is keyset-paged on indexed columns, so a page costs the same at
100,000 runs as at 10.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

from crawlhub.control.db import ControlDB, Tx
from crawlhub.control.jobs.model import FINAL, LIVE, JobSpec, RunRecord, TaskRecord
from crawlhub.core.errors import ConflictError, NotFoundError
from crawlhub.core.process import pid_alive

#: A live run whose runner has not beaten for this long is lost (its host died).
STALE_AFTER = 30.0

HOST = socket.gethostname()

_RUN_COLUMNS = ("id, job, kind, status, trigger_, host, pid, scheduled_for, started_at,"
                " finished_at, heartbeat_at, exit_code, error, counters, version,"
                " log_dropped, paused")
#: Columns added to ``runs`` after its first release: (name, type), added when missing.
_RUN_ADDED = (("log_dropped", "BIGINT NOT NULL DEFAULT 0"), ("paused", "TEXT"))


def new_run_id(now: float | None = None) -> str:
    """A run code that sorts by start time: ``r`` + milliseconds (hex) + 6 random hex."""
    millis = int((time.time() if now is None else now) * 1000)
    return f"r{millis:011x}{secrets.token_hex(3)}"


class JobStore:
    """The ``jobs``, ``runs`` and ``run_tasks`` tables."""

    def __init__(self, db: ControlDB) -> None:
        self.db = db
        self.jobs = db.table("jobs")
        self.runs = db.table("runs")
        self.tasks = db.table("run_tasks")
        self.stops = db.table("run_stops")

    async def open(self) -> None:
        j, r, t = self.jobs, self.runs, self.tasks
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {j} (name TEXT PRIMARY KEY, kind TEXT NOT NULL,"
            " spec TEXT NOT NULL, next_fire DOUBLE PRECISION,"
            " created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {j}_next ON {j} (next_fire)",
            f"CREATE TABLE IF NOT EXISTS {r} (id TEXT PRIMARY KEY, job TEXT NOT NULL,"
            " kind TEXT NOT NULL, status TEXT NOT NULL, trigger_ TEXT NOT NULL,"
            " host TEXT NOT NULL, pid BIGINT, scheduled_for DOUBLE PRECISION,"
            " started_at DOUBLE PRECISION NOT NULL, finished_at DOUBLE PRECISION,"
            " heartbeat_at DOUBLE PRECISION, exit_code BIGINT, error TEXT,"
            " counters TEXT NOT NULL, version TEXT)",
            f"CREATE INDEX IF NOT EXISTS {r}_job ON {r} (job, id)",
            f"CREATE INDEX IF NOT EXISTS {r}_status ON {r} (status, id)",
            f"CREATE TABLE IF NOT EXISTS {t} (run TEXT NOT NULL, task TEXT NOT NULL,"
            " status TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL,"
            " finished_at DOUBLE PRECISION, detail TEXT NOT NULL,"
            " PRIMARY KEY (run, task))",
            # a run asked to stop by another process (its runner polls); gone at its end
            f"CREATE TABLE IF NOT EXISTS {self.stops} (run TEXT PRIMARY KEY,"
            " asked_at DOUBLE PRECISION NOT NULL)",
        ])
        await self._add_columns(r, _RUN_ADDED)

    async def _add_columns(self, table: str, columns: Sequence[tuple[str, str]]) -> None:
        """Add the ``columns`` a table made by an older release lacks."""
        if self.db.dialect == "postgresql":
            await self.db.schema([f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {kind}"
                                  for name, kind in columns])
            return
        have = {row[0] for row in await self.db.fetch(
            "SELECT name FROM pragma_table_info($1)", table)}
        missing = [f"ALTER TABLE {table} ADD COLUMN {name} {kind}"
                   for name, kind in columns if name not in have]
        if missing:
            await self.db.schema(missing)

    # -- jobs ---------------------------------------------------------------------------
    async def create(self, spec: JobSpec, now: float) -> None:
        fire = spec.next_fire(now) if spec.enabled else None
        count = await self.db.execute(
            f"INSERT INTO {self.jobs} (name, kind, spec, next_fire, created_at, updated_at)"
            " VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (name) DO NOTHING",
            spec.name, spec.kind, spec.model_dump_json(), fire, now)
        if count == 0:
            raise ConflictError(f"job {spec.name!r} exists; PATCH /jobs/{spec.name} changes"
                                " it, DELETE removes it")

    async def replace(self, spec: JobSpec, now: float) -> None:
        fire = spec.next_fire(now) if spec.enabled else None
        count = await self.db.execute(
            f"UPDATE {self.jobs} SET spec = $2, next_fire = $3, updated_at = $4"
            " WHERE name = $1", spec.name, spec.model_dump_json(), fire, now)
        if count == 0:
            raise NotFoundError(f"no job named {spec.name!r}")

    async def delete(self, name: str) -> None:
        if await self.db.execute(f"DELETE FROM {self.jobs} WHERE name = $1", name) == 0:
            raise NotFoundError(f"no job named {name!r}")

    async def get(self, name: str) -> JobSpec:
        row = await self.db.fetchone(f"SELECT spec FROM {self.jobs} WHERE name = $1", name)
        if row is None:
            raise NotFoundError(f"no job named {name!r}; GET /jobs/ lists them")
        return JobSpec.model_validate_json(row[0])

    async def find(self, name: str) -> JobSpec | None:
        row = await self.db.fetchone(f"SELECT spec FROM {self.jobs} WHERE name = $1", name)
        return None if row is None else JobSpec.model_validate_json(row[0])

    async def list_jobs(self, *, after: str | None = None, limit: int = 100,
                   kind: str | None = None, prefix: str | None = None
                   ) -> list[tuple[JobSpec, float | None]]:
        """Jobs by name after ``after``, with their next cron time."""
        where: list[str] = ["1 = 1"]
        args: list[Any] = []
        if after is not None:
            args.append(after)
            where.append(f"name > ${len(args)}")
        if kind is not None:
            args.append(kind)
            where.append(f"kind = ${len(args)}")
        if prefix:
            args.append(_like_prefix(prefix))
            where.append(f"name LIKE ${len(args)} ESCAPE '\\'")
        args.append(limit)
        rows = await self.db.fetch(
            f"SELECT spec, next_fire FROM {self.jobs} WHERE {' AND '.join(where)}"
            f" ORDER BY name LIMIT ${len(args)}", *args)
        return [(JobSpec.model_validate_json(spec), fire) for spec, fire in rows]

    async def count(self) -> int:
        row = await self.db.fetchone(f"SELECT COUNT(*) FROM {self.jobs}")
        return int(row[0]) if row else 0

    async def next_fire(self, name: str) -> float | None:
        row = await self.db.fetchone(f"SELECT next_fire FROM {self.jobs} WHERE name = $1",
                                     name)
        return None if row is None or row[0] is None else float(row[0])

    async def due(self, now: float, limit: int = 100) -> list[tuple[str, float]]:
        """Jobs whose cron tick is due: (name, the tick's time)."""
        rows = await self.db.fetch(
            f"SELECT name, next_fire FROM {self.jobs} WHERE next_fire IS NOT NULL AND"
            " next_fire <= $1 ORDER BY next_fire LIMIT $2", now, limit)
        return [(name, float(fire)) for name, fire in rows]

    async def earliest_fire(self) -> float | None:
        row = await self.db.fetchone(f"SELECT MIN(next_fire) FROM {self.jobs}")
        return None if row is None or row[0] is None else float(row[0])

    async def claim_tick(self, name: str, tick: float, following: float | None) -> bool:
        """Move ``name``'s next tick from ``tick`` to ``following``; True for the one
        scheduler that moved it (it fires the tick), False for the others."""
        count = await self.db.execute(
            f"UPDATE {self.jobs} SET next_fire = $3 WHERE name = $1 AND next_fire = $2",
            name, tick, following)
        return count == 1

    # -- runs ---------------------------------------------------------------------------
    async def claim_run(self, spec: JobSpec, *, trigger: str, now: float,
                        scheduled_for: float | None = None, version: str | None = None,
                        run_id: str | None = None) -> RunRecord:
        """A new ``running`` run of ``spec``, unless ``max_instances`` runs are live:
        then :class:`ConflictError` naming them. Live runs whose runner stopped beating
        over :data:`STALE_AFTER` ago are marked ``lost`` first (their host died)."""
        run = RunRecord(id=run_id or new_run_id(now), job=spec.name, kind=spec.kind,
                        status="running", trigger=trigger, host=HOST, pid=os.getpid(),
                        scheduled_for=scheduled_for, started_at=now, heartbeat_at=now,
                        version=version)

        async def steps(tx: Tx) -> list[str]:
            await tx.execute(
                f"UPDATE {self.runs} SET status = 'lost', finished_at = $2, error = $3"
                " WHERE job = $1 AND status IN ('queued', 'running')"
                " AND heartbeat_at < $4", spec.name, now,
                "its runner stopped reporting (host or process died)", now - STALE_AFTER)
            live = await tx.fetch(
                f"SELECT id FROM {self.runs} WHERE job = $1 AND status IN"
                " ('queued', 'running') ORDER BY id", spec.name)
            if len(live) >= spec.max_instances:
                return [row[0] for row in live]
            await tx.execute(*self._insert(run))
            return []

        busy = await self.db.transaction(steps, lock=f"job:{spec.name}")
        if busy:
            raise ConflictError(
                f"job {spec.name!r} has {len(busy)} run(s) going ({', '.join(busy[:5])}) and"
                f" max_instances is {spec.max_instances}; cancel one or raise max_instances")
        return run

    def _insert(self, run: RunRecord) -> tuple[Any, ...]:
        return (f"INSERT INTO {self.runs} ({_RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6,"
                " $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
                run.id, run.job, run.kind, run.status, run.trigger, run.host, run.pid,
                run.scheduled_for, run.started_at, run.finished_at, run.heartbeat_at,
                run.exit_code, run.error, json.dumps(run.counters), run.version,
                run.log_dropped, run.paused)

    async def record_skip(self, spec: JobSpec, *, trigger: str, now: float,
                          scheduled_for: float | None, why: str) -> RunRecord:
        """A ``skipped`` run: the tick that did not run, and why."""
        run = RunRecord(id=new_run_id(now), job=spec.name, kind=spec.kind, status="skipped",
                        trigger=trigger, host=HOST, pid=None, scheduled_for=scheduled_for,
                        started_at=now, finished_at=now, error=why)
        await self.db.execute(*self._insert(run))
        return run

    async def beat(self, run_id: str, now: float, counters: dict[str, Any] | None = None,
                   pid: int | None = None, log_dropped: int | None = None) -> None:
        """The runner is alive; the run's counters so far, and its log lines dropped."""
        if counters is None:
            await self.db.execute(
                f"UPDATE {self.runs} SET heartbeat_at = $2, pid = COALESCE($3, pid),"
                " log_dropped = COALESCE($4, log_dropped) WHERE id = $1",
                run_id, now, pid, log_dropped)
        else:
            await self.db.execute(
                f"UPDATE {self.runs} SET heartbeat_at = $2, counters = $3,"
                " pid = COALESCE($4, pid), log_dropped = COALESCE($5, log_dropped)"
                " WHERE id = $1", run_id, now, json.dumps(counters), pid, log_dropped)

    async def set_paused(self, run_id: str, how: str | None) -> None:
        """How the run's pause took effect (``cooperative``: the job acknowledged it;
        ``signal``: its processes were stopped), or None: running."""
        await self.db.execute(f"UPDATE {self.runs} SET paused = $2 WHERE id = $1",
                              run_id, how)

    async def finish(self, run_id: str, *, status: str, now: float, exit_code: int | None,
                     error: str | None, counters: dict[str, Any] | None,
                     log_dropped: int | None = None) -> None:
        if status not in FINAL:
            raise ValueError(f"{status!r} is not a final run status")
        await self.db.execute(
            f"UPDATE {self.runs} SET status = $2, finished_at = $3, exit_code = $4,"
            " error = $5, counters = COALESCE($6, counters), heartbeat_at = $3,"
            " log_dropped = COALESCE($7, log_dropped), paused = NULL"
            " WHERE id = $1", run_id, status, now, exit_code, error,
            None if counters is None else json.dumps(counters), log_dropped)
        await self.db.execute(f"DELETE FROM {self.stops} WHERE run = $1", run_id)
        # Tasks a run left open end with it.
        await self.db.execute(
            f"UPDATE {self.tasks} SET status = $2, finished_at = $3 WHERE run = $1 AND"
            " status = 'running'", run_id, "succeeded" if status == "succeeded" else "failed",
            now)

    async def ask_stop(self, run_id: str, now: float) -> None:
        """Ask the runner of ``run_id`` (in whichever process) to stop it."""
        await self.db.execute(
            f"INSERT INTO {self.stops} (run, asked_at) VALUES ($1, $2)"
            " ON CONFLICT (run) DO NOTHING", run_id, now)

    async def stop_asked(self, run_id: str) -> bool:
        return await self.db.fetchone(
            f"SELECT 1 FROM {self.stops} WHERE run = $1", run_id) is not None

    async def run(self, run_id: str) -> RunRecord:
        row = await self.db.fetchone(f"SELECT {_RUN_COLUMNS} FROM {self.runs} WHERE id = $1",
                                     run_id)
        if row is None:
            raise NotFoundError(f"no run {run_id!r}; GET /runs/ lists them")
        return _run(row)

    async def list_runs(self, *, job: str | None = None, status: Sequence[str] = (),
                        before: str | None = None, limit: int = 50) -> list[RunRecord]:
        """Newest first, keyset-paged by id (ids sort by start time)."""
        where: list[str] = ["1 = 1"]
        args: list[Any] = []
        if job is not None:
            args.append(job)
            where.append(f"job = ${len(args)}")
        if status:
            marks = []
            for value in status:
                args.append(value)
                marks.append(f"${len(args)}")
            where.append(f"status IN ({', '.join(marks)})")
        if before is not None:
            args.append(before)
            where.append(f"id < ${len(args)}")
        args.append(limit)
        rows = await self.db.fetch(
            f"SELECT {_RUN_COLUMNS} FROM {self.runs} WHERE {' AND '.join(where)}"
            f" ORDER BY id DESC LIMIT ${len(args)}", *args)
        return [_run(row) for row in rows]

    async def live_runs(self, job: str | None = None) -> list[RunRecord]:
        return await self.list_runs(job=job, status=LIVE, limit=1000)

    async def last_run(self, job: str) -> RunRecord | None:
        rows = await self.db.fetch(
            f"SELECT {_RUN_COLUMNS} FROM {self.runs} WHERE job = $1 AND status <> 'skipped'"
            " ORDER BY id DESC LIMIT 1", job)
        return _run(rows[0]) if rows else None

    async def summaries(self, jobs: Sequence[str]
                        ) -> tuple[dict[str, list[str]], dict[str, list[str]],
                                   dict[str, RunRecord]]:
        """For a page of jobs, in two statements: the ids of each job's live runs, those
        of them whose pause took effect, and each job's newest run that is not a skipped
        tick."""
        if not jobs:
            return {}, {}, {}
        marks = ", ".join(f"${i}" for i in range(1, len(jobs) + 1))
        live: dict[str, list[str]] = {}
        paused: dict[str, list[str]] = {}
        for job, run_id, how in await self.db.fetch(
                f"SELECT job, id, paused FROM {self.runs} WHERE job IN ({marks}) AND status"
                " IN ('queued', 'running') ORDER BY id", *jobs):
            live.setdefault(job, []).append(run_id)
            if how:
                paused.setdefault(job, []).append(run_id)
        rows = await self.db.fetch(
            f"SELECT {_RUN_COLUMNS} FROM {self.runs} WHERE id IN (SELECT MAX(id) FROM"
            f" {self.runs} WHERE job IN ({marks}) AND status <> 'skipped' GROUP BY job)", *jobs)
        return live, paused, {row[1]: _run(row) for row in rows}

    async def lose_dead_runs(
            self, now: float, *, host: str = HOST,
            stop_orphans: Callable[[list[str]], Awaitable[Mapping[str, str]]] | None = None,
            quiet_for: float = 0.0, skip: Collection[str] = ()) -> int:
        """Mark ``lost`` the live runs this host started in a process that is gone (a
        server restarted after SIGKILL): the runs cannot report any more. The job
        processes such a server left running are stopped first: ``stop_orphans(run
        ids)`` stops them and names their runs, each with what happened (the run's error). ``quiet_for``: only runs whose runner
        has not beaten for that many seconds (a live server's runs are left alone);
        ``skip``: runs of the calling process."""
        sql = (f"SELECT id, pid FROM {self.runs} WHERE status IN ('queued', 'running')"
               " AND host = $1")
        args: list[Any] = [host]
        if quiet_for:
            sql += " AND (heartbeat_at IS NULL OR heartbeat_at <= $2)"
            args.append(now - quiet_for)
        rows = await self.db.fetch(sql, *args)
        rows = [row for row in rows if row[0] not in skip]
        stopped: Mapping[str, str] = (await stop_orphans([row[0] for row in rows])
                                      if stop_orphans and rows else {})
        lost = 0
        for run_id, pid in rows:
            if run_id in stopped:
                why = stopped[run_id]
            elif pid is not None and pid_alive(int(pid)):
                continue
            else:
                why = "the process that ran it ended without recording the end (killed?)"
            lost += await self.db.execute(
                f"UPDATE {self.runs} SET status = 'lost', finished_at = $2, error = $3"
                " WHERE id = $1 AND status IN ('queued', 'running')", run_id, now, why)
            await self.db.execute(f"DELETE FROM {self.stops} WHERE run = $1", run_id)
        return lost

    async def lose_stale_runs(self, now: float) -> int:
        """Mark ``lost`` the live runs of any host whose runner has not beaten for
        :data:`STALE_AFTER` seconds (its host or server died and did not come back)."""
        return await self.db.execute(
            f"UPDATE {self.runs} SET status = 'lost', finished_at = $1, error = $2"
            " WHERE status IN ('queued', 'running') AND heartbeat_at < $3", now,
            "its runner stopped reporting (host or process died)", now - STALE_AFTER)

    # -- timeline -----------------------------------------------------------------------
    async def task_event(self, run_id: str, task: str, status: str, ts: float,
                         detail: str = "") -> None:
        """A task of the run started (``running``) or ended (``succeeded``/``failed``)."""
        if status == "running":
            await self.db.execute(
                f"INSERT INTO {self.tasks} (run, task, status, started_at, detail)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (run, task) DO UPDATE SET"
                " status = $3, detail = $5, finished_at = NULL", run_id, task, status, ts,
                detail)
            return
        await self.db.execute(
            f"INSERT INTO {self.tasks} (run, task, status, started_at, finished_at, detail)"
            " VALUES ($1, $2, $3, $4, $4, $5) ON CONFLICT (run, task) DO UPDATE SET"
            " status = $3, finished_at = $4, detail = $5", run_id, task, status, ts, detail)

    async def run_tasks(self, run_id: str, *, limit: int = 10_000) -> list[TaskRecord]:
        rows = await self.db.fetch(
            f"SELECT run, task, status, started_at, finished_at, detail FROM {self.tasks}"
            " WHERE run = $1 ORDER BY started_at, task LIMIT $2", run_id, limit)
        return [TaskRecord(run=r[0], task=r[1], status=r[2], started_at=r[3],
                           finished_at=r[4], detail=r[5]) for r in rows]


def _run(row: tuple[Any, ...]) -> RunRecord:
    (run_id, job, kind, status, trigger, host, pid, scheduled_for, started_at, finished_at,
     heartbeat_at, exit_code, error, counters, version, log_dropped, paused) = row
    return RunRecord(id=run_id, job=job, kind=kind, status=status, trigger=trigger,
                     host=host, pid=pid, scheduled_for=scheduled_for, started_at=started_at,
                     finished_at=finished_at, heartbeat_at=heartbeat_at,
                     exit_code=exit_code, error=error,
                     counters=json.loads(counters) if counters else {}, version=version,
                     log_dropped=int(log_dropped or 0), paused=paused)


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"



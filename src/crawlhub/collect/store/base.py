"""The metadata store of collection jobs: progress, cursors, run history, run leases,
pending detail ids and recent job log lines.

One small protocol; the SQL lives here once and runs on the one SQL runner
(:class:`crawlhub.backends.sql.SqlDB`: a SQLite file or PostgreSQL), so both behave the
same (one conformance suite).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from crawlhub.backends.sql import SqlDB, check_table_prefix


@dataclass(slots=True)
class Progress:
    """Where one job stands.

    ``run_id`` is set while a run is in flight (a run that died keeps it: the next run
    sees a crash); ``start_offset`` is the current/last run's start offset (the seed's
    ``last_start_offset``), ``saved_offset`` the next offset it would request,
    ``last_total`` the total it saw; ``state`` is the strategy's own resumable state.
    """

    job: str
    run_id: str | None = None
    status: str = "idle"
    start_offset: int | None = None
    saved_offset: int | None = None
    last_total: int | None = None
    state: dict[str, Any] = field(default_factory=dict)
    updated_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "run_id": self.run_id,
            "status": self.status,
            "start_offset": self.start_offset,
            "saved_offset": self.saved_offset,
            "last_total": self.last_total,
            "state": self.state,
            "updated_at": self.updated_at,
        }


@dataclass(slots=True)
class JobRunRecord:
    """The stored record of one run of a job (a :class:`~crawlhub.collect.runner.JobRun`):
    when, how it ended, its RunResult and its log lines."""

    run_id: str
    job: str
    strategy: str
    status: str
    started_at: float
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    log: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "job": self.job,
            "strategy": self.strategy,
            "status": self.status,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "result": self.result,
            "log": self.log,
        }


@dataclass(frozen=True, slots=True)
class Lease:
    """Who runs a job now: the one row that makes a run exclusive across processes.

    ``owner`` is unique per run attempt; ``pid``/``host``/``since`` say where and since
    when; the holder renews ``expires_at`` while it runs (heartbeat), and anyone may take
    an expired lease over. ``stop`` is a stop request left for the holder (or None).
    """

    job: str
    owner: str
    run_id: str | None
    pid: int
    host: str
    since: float
    expires_at: float
    stop: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "owner": self.owner,
            "run_id": self.run_id,
            "pid": self.pid,
            "host": self.host,
            "since": self.since,
            "expires_at": self.expires_at,
            "stop": self.stop,
        }


@runtime_checkable
class MetadataStore(Protocol):
    """Progress, cursors, run history, run leases, pending detail ids and recent log lines
    of collection jobs. Callers: JobRun (one run), CollectJobManager (the API), the CLI.

    Leases: ``acquire_lease`` takes the job's lease when it is free, expired, ours, or
    held by ``take_from`` (a holder known dead), in one atomic statement, and returns the
    holder after the attempt (compare its ``owner``); ``renew_lease`` returns None once
    the lease is no longer ours. Detail ids are a set per job (adding one twice keeps
    one), read oldest first. Log lines are kept per job, at most ``keep`` of them.
    """

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def load_progress(self, job: str) -> Progress | None: ...

    async def save_progress(self, progress: Progress) -> None: ...

    async def get_cursor(self, job: str, name: str) -> str | None: ...

    async def set_cursor(self, job: str, name: str, value: str) -> None: ...

    async def start_run(self, run: JobRunRecord) -> None: ...

    async def finish_run(self, run: JobRunRecord) -> None: ...

    async def runs(self, job: str, limit: int = 20) -> list[JobRunRecord]: ...

    async def acquire_lease(
        self,
        job: str,
        owner: str,
        *,
        run_id: str | None,
        pid: int,
        host: str,
        now: float,
        ttl: float,
        take_from: str | None = None,
    ) -> Lease: ...

    async def renew_lease(self, job: str, owner: str, *, now: float, ttl: float) -> Lease | None: ...

    async def release_lease(self, job: str, owner: str) -> None: ...

    async def lease(self, job: str) -> Lease | None: ...

    async def request_stop(self, job: str, reason: str) -> Lease | None: ...

    async def add_detail_ids(self, job: str, ids: Sequence[Any]) -> None: ...

    async def detail_ids(self, job: str, limit: int | None = None) -> list[Any]: ...

    async def remove_detail_ids(self, job: str, ids: Sequence[Any]) -> None: ...

    async def count_detail_ids(self, job: str) -> int: ...

    async def append_log(self, job: str, lines: Sequence[dict[str, Any]], *, keep: int) -> None: ...

    async def log_lines(self, job: str, n: int) -> list[dict[str, Any]]: ...


_LEASE_COLUMNS = "job, owner, run_id, pid, host, since, expires_at, stop"
_log_seq = itertools.count()


def _lease(row: tuple[Any, ...]) -> Lease:
    return Lease(
        job=row[0],
        owner=row[1],
        run_id=row[2],
        pid=int(row[3]),
        host=row[4],
        since=float(row[5]),
        expires_at=float(row[6]),
        stop=row[7],
    )


def _id_text(ident: Any) -> str:
    """A detail id as stored: its JSON text (ids come from JSON answers)."""
    return json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)


class MetadataDB(SqlDB):
    """A :class:`SqlDB` whose errors speak of the metadata store and
    ``storage.metadata``."""

    what = "metadata store"
    key = "storage.metadata"


class SqlMetadataStore:
    """The store on ``url`` (``sqlite:///...`` embedded, ``postgresql://...``).

    Statements use ``$1, $2`` placeholders (PostgreSQL's; SQLite reads them as ``?1``).
    Columns are TEXT / BIGINT / DOUBLE PRECISION so one DDL fits both databases.
    """

    def __init__(self, url: str, *, table_prefix: str = "crawlhub_collect_") -> None:
        p = check_table_prefix(table_prefix)
        self.url = url
        self._db = MetadataDB(url)
        self._connected = False
        self.progress_table = f"{p}progress"
        self.cursors_table = f"{p}cursors"
        self.runs_table = f"{p}runs"
        self.leases_table = f"{p}leases"
        self.detail_table = f"{p}detail_ids"
        self.log_table = f"{p}log"
        self._ddl = [
            f"CREATE TABLE IF NOT EXISTS {p}progress (job TEXT PRIMARY KEY, run_id TEXT,"
            " status TEXT NOT NULL, start_offset BIGINT, saved_offset BIGINT,"
            " last_total BIGINT, state TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {p}cursors (job TEXT NOT NULL, name TEXT NOT NULL,"
            " value TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL,"
            " PRIMARY KEY (job, name))",
            f"CREATE TABLE IF NOT EXISTS {p}runs (run_id TEXT PRIMARY KEY, job TEXT NOT NULL,"
            " strategy TEXT NOT NULL, status TEXT NOT NULL,"
            " started_at DOUBLE PRECISION NOT NULL, finished_at DOUBLE PRECISION,"
            " result TEXT, log TEXT)",
            f"CREATE INDEX IF NOT EXISTS {p}runs_job_started ON {p}runs (job, started_at)",
            f"CREATE TABLE IF NOT EXISTS {p}leases (job TEXT PRIMARY KEY, owner TEXT NOT NULL,"
            " run_id TEXT, pid BIGINT NOT NULL, host TEXT NOT NULL,"
            " since DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL,"
            " stop TEXT)",
            f"CREATE TABLE IF NOT EXISTS {p}detail_ids (job TEXT NOT NULL, item TEXT NOT NULL,"
            " pos BIGINT NOT NULL, PRIMARY KEY (job, item))",
            f"CREATE INDEX IF NOT EXISTS {p}detail_ids_pos ON {p}detail_ids (job, pos)",
            f"CREATE TABLE IF NOT EXISTS {p}log (job TEXT NOT NULL,"
            " ts DOUBLE PRECISION NOT NULL, seq BIGINT NOT NULL, line TEXT NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {p}log_job_ts ON {p}log (job, ts, seq)",
        ]

    # -- statements (the runner's, named as the SQL below calls them) -------------------
    async def _connect(self) -> None:
        await self._db.connect()

    async def _disconnect(self) -> None:
        await self._db.close()

    async def _execute(self, sql: str, *args: Any) -> None:
        await self._db.execute(sql, *args)

    async def _fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Rows of a query, or of a writing statement with RETURNING (committed)."""
        return await self._db.fetch(sql, *args)

    async def _executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """One statement over many argument rows, in one transaction."""
        await self._db.executemany(sql, rows)

    # -- protocol --------------------------------------------------------------------
    async def open(self) -> None:
        if not self._connected:
            await self._connect()
            self._connected = True
        for stmt in self._ddl:
            await self._execute(stmt)

    async def close(self) -> None:
        if self._connected:
            await self._disconnect()
            self._connected = False

    async def load_progress(self, job: str) -> Progress | None:
        rows = await self._fetch(
            f"SELECT job, run_id, status, start_offset, saved_offset, last_total, state,"
            f" updated_at FROM {self.progress_table} WHERE job = $1",
            job,
        )
        if not rows:
            return None
        r = rows[0]
        return Progress(
            job=r[0],
            run_id=r[1],
            status=r[2],
            start_offset=r[3],
            saved_offset=r[4],
            last_total=r[5],
            state=json.loads(r[6]),
            updated_at=float(r[7]),
        )

    async def save_progress(self, progress: Progress) -> None:
        progress.updated_at = time.time()
        await self._execute(
            f"INSERT INTO {self.progress_table} (job, run_id, status, start_offset,"
            " saved_offset, last_total, state, updated_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (job) DO UPDATE SET"
            " run_id = excluded.run_id, status = excluded.status,"
            " start_offset = excluded.start_offset, saved_offset = excluded.saved_offset,"
            " last_total = excluded.last_total, state = excluded.state,"
            " updated_at = excluded.updated_at",
            progress.job,
            progress.run_id,
            progress.status,
            progress.start_offset,
            progress.saved_offset,
            progress.last_total,
            json.dumps(progress.state),
            progress.updated_at,
        )

    async def get_cursor(self, job: str, name: str) -> str | None:
        rows = await self._fetch(
            f"SELECT value FROM {self.cursors_table} WHERE job = $1 AND name = $2", job, name
        )
        return str(rows[0][0]) if rows else None

    async def set_cursor(self, job: str, name: str, value: str) -> None:
        await self._execute(
            f"INSERT INTO {self.cursors_table} (job, name, value, updated_at)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (job, name) DO UPDATE SET"
            " value = excluded.value, updated_at = excluded.updated_at",
            job,
            name,
            value,
            time.time(),
        )

    async def start_run(self, run: JobRunRecord) -> None:
        await self._execute(
            f"INSERT INTO {self.runs_table} (run_id, job, strategy, status, started_at)"
            " VALUES ($1, $2, $3, $4, $5)",
            run.run_id,
            run.job,
            run.strategy,
            run.status,
            run.started_at,
        )

    async def finish_run(self, run: JobRunRecord) -> None:
        await self._execute(
            f"UPDATE {self.runs_table} SET status = $2, finished_at = $3, result = $4,"
            " log = $5 WHERE run_id = $1",
            run.run_id,
            run.status,
            run.finished_at,
            json.dumps(run.result) if run.result is not None else None,
            json.dumps(run.log),
        )

    async def runs(self, job: str, limit: int = 20) -> list[JobRunRecord]:
        rows = await self._fetch(
            f"SELECT run_id, job, strategy, status, started_at, finished_at, result, log"
            f" FROM {self.runs_table} WHERE job = $1 ORDER BY started_at DESC LIMIT $2",
            job,
            limit,
        )
        return [
            JobRunRecord(
                run_id=r[0],
                job=r[1],
                strategy=r[2],
                status=r[3],
                started_at=float(r[4]),
                finished_at=float(r[5]) if r[5] is not None else None,
                result=json.loads(r[6]) if r[6] else None,
                log=json.loads(r[7]) if r[7] else [],
            )
            for r in rows
        ]

    # -- run leases --------------------------------------------------------------------
    async def acquire_lease(
        self,
        job: str,
        owner: str,
        *,
        run_id: str | None,
        pid: int,
        host: str,
        now: float,
        ttl: float,
        take_from: str | None = None,
    ) -> Lease:
        t = self.leases_table
        # One statement decides: insert, or take over a lease that is expired, ours, or
        # held by ``take_from``; otherwise the row stays as it is.
        rows = await self._fetch(
            f"INSERT INTO {t} ({_LEASE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)"
            f" ON CONFLICT (job) DO UPDATE SET owner = excluded.owner,"
            " run_id = excluded.run_id, pid = excluded.pid, host = excluded.host,"
            " since = excluded.since, expires_at = excluded.expires_at, stop = NULL"
            f" WHERE {t}.expires_at <= $8 OR {t}.owner = $2 OR {t}.owner = $9"
            f" RETURNING {_LEASE_COLUMNS}",
            job,
            owner,
            run_id,
            pid,
            host,
            now,
            now + ttl,
            now,
            take_from if take_from is not None else owner,
        )
        if rows:
            return _lease(rows[0])
        holder = await self.lease(job)
        if holder is None:  # released between the two statements: try once more
            return await self.acquire_lease(
                job, owner, run_id=run_id, pid=pid, host=host, now=now, ttl=ttl
            )
        return holder

    async def renew_lease(self, job: str, owner: str, *, now: float, ttl: float) -> Lease | None:
        rows = await self._fetch(
            f"UPDATE {self.leases_table} SET expires_at = $3 WHERE job = $1 AND owner = $2"
            f" RETURNING {_LEASE_COLUMNS}",
            job,
            owner,
            now + ttl,
        )
        return _lease(rows[0]) if rows else None

    async def release_lease(self, job: str, owner: str) -> None:
        await self._execute(
            f"DELETE FROM {self.leases_table} WHERE job = $1 AND owner = $2", job, owner
        )

    async def lease(self, job: str) -> Lease | None:
        rows = await self._fetch(
            f"SELECT {_LEASE_COLUMNS} FROM {self.leases_table} WHERE job = $1", job
        )
        return _lease(rows[0]) if rows else None

    async def request_stop(self, job: str, reason: str) -> Lease | None:
        rows = await self._fetch(
            f"UPDATE {self.leases_table} SET stop = $2 WHERE job = $1"
            f" RETURNING {_LEASE_COLUMNS}",
            job,
            reason,
        )
        return _lease(rows[0]) if rows else None

    # -- pending detail ids ------------------------------------------------------------
    async def add_detail_ids(self, job: str, ids: Sequence[Any]) -> None:
        if not ids:
            return
        base = time.time_ns()
        await self._executemany(
            f"INSERT INTO {self.detail_table} (job, item, pos) VALUES ($1, $2, $3)"
            " ON CONFLICT (job, item) DO NOTHING",
            [(job, _id_text(ident), base + n) for n, ident in enumerate(ids)],
        )

    async def detail_ids(self, job: str, limit: int | None = None) -> list[Any]:
        sql = f"SELECT item FROM {self.detail_table} WHERE job = $1 ORDER BY pos, item"
        if limit is not None:
            rows = await self._fetch(sql + " LIMIT $2", job, limit)
        else:
            rows = await self._fetch(sql, job)
        return [json.loads(r[0]) for r in rows]

    async def remove_detail_ids(self, job: str, ids: Sequence[Any]) -> None:
        if not ids:
            return
        await self._executemany(
            f"DELETE FROM {self.detail_table} WHERE job = $1 AND item = $2",
            [(job, _id_text(ident)) for ident in ids],
        )

    async def count_detail_ids(self, job: str) -> int:
        rows = await self._fetch(f"SELECT COUNT(*) FROM {self.detail_table} WHERE job = $1", job)
        return int(rows[0][0])

    # -- recent log lines --------------------------------------------------------------
    async def append_log(self, job: str, lines: Sequence[dict[str, Any]], *, keep: int) -> None:
        if lines:
            await self._executemany(
                f"INSERT INTO {self.log_table} (job, ts, seq, line) VALUES ($1, $2, $3, $4)",
                [
                    (job, float(line.get("ts", 0.0)), next(_log_seq), json.dumps(line, default=str))
                    for line in lines
                ],
            )
        # Bounded per job: everything older than the keep-th newest line goes.
        rows = await self._fetch(
            f"SELECT ts, seq FROM {self.log_table} WHERE job = $1"
            " ORDER BY ts DESC, seq DESC LIMIT 1 OFFSET $2",
            job,
            keep,
        )
        if rows:
            await self._execute(
                f"DELETE FROM {self.log_table} WHERE job = $1"
                " AND (ts < $2 OR (ts = $2 AND seq <= $3))",
                job,
                rows[0][0],
                rows[0][1],
            )

    async def log_lines(self, job: str, n: int) -> list[dict[str, Any]]:
        """The newest ``n`` lines of ``job``, oldest first."""
        if n <= 0:
            return []
        rows = await self._fetch(
            f"SELECT line FROM {self.log_table} WHERE job = $1"
            " ORDER BY ts DESC, seq DESC LIMIT $2",
            job,
            n,
        )
        return [json.loads(r[0]) for r in reversed(rows)]

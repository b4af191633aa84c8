"""The metadata store of collection jobs: progress, cursors and run history.

One small protocol; the SQL lives here once and the backends (``sqlite.py``,
``postgres.py``) only run it, so both behave the same (one conformance suite).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from crawlhub.errors import ConfigError


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
class RunRecord:
    """One run of a job: when, how it ended, its RunResult and its log lines."""

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


@runtime_checkable
class MetadataStore(Protocol):
    """Progress, cursors and run history of collection jobs. Callers: collectors, JobManager."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def load_progress(self, job: str) -> Progress | None: ...

    async def save_progress(self, progress: Progress) -> None: ...

    async def get_cursor(self, job: str, name: str) -> str | None: ...

    async def set_cursor(self, job: str, name: str, value: str) -> None: ...

    async def start_run(self, run: RunRecord) -> None: ...

    async def finish_run(self, run: RunRecord) -> None: ...

    async def runs(self, job: str, limit: int = 20) -> list[RunRecord]: ...


_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")


class SqlMetadataStore:
    """The store's SQL, shared by the backends; they implement the four ``_`` methods.

    Statements use ``$1, $2`` placeholders (PostgreSQL's); SQLite reads them as ``?1``.
    Columns are TEXT / BIGINT / DOUBLE PRECISION so one DDL fits both databases.
    """

    def __init__(self, *, table_prefix: str = "crawlhub_collect_") -> None:
        if not _PREFIX_RE.match(table_prefix):
            raise ConfigError(
                f"table prefix {table_prefix!r} is not a plain SQL identifier; "
                "use letters, digits and underscores",
                key="table_prefix",
            )
        p = table_prefix
        self._connected = False
        self.progress_table = f"{p}progress"
        self.cursors_table = f"{p}cursors"
        self.runs_table = f"{p}runs"
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
        ]

    # -- backend hooks ---------------------------------------------------------------
    async def _connect(self) -> None:
        raise NotImplementedError

    async def _disconnect(self) -> None:
        raise NotImplementedError

    async def _execute(self, sql: str, *args: Any) -> None:
        raise NotImplementedError

    async def _fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

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

    async def start_run(self, run: RunRecord) -> None:
        await self._execute(
            f"INSERT INTO {self.runs_table} (run_id, job, strategy, status, started_at)"
            " VALUES ($1, $2, $3, $4, $5)",
            run.run_id,
            run.job,
            run.strategy,
            run.status,
            run.started_at,
        )

    async def finish_run(self, run: RunRecord) -> None:
        await self._execute(
            f"UPDATE {self.runs_table} SET status = $2, finished_at = $3, result = $4,"
            " log = $5 WHERE run_id = $1",
            run.run_id,
            run.status,
            run.finished_at,
            json.dumps(run.result) if run.result is not None else None,
            json.dumps(run.log),
        )

    async def runs(self, job: str, limit: int = 20) -> list[RunRecord]:
        rows = await self._fetch(
            f"SELECT run_id, job, strategy, status, started_at, finished_at, result, log"
            f" FROM {self.runs_table} WHERE job = $1 ORDER BY started_at DESC LIMIT $2",
            job,
            limit,
        )
        return [
            RunRecord(
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

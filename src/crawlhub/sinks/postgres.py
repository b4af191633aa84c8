"""PostgreSQL sink: upsert or SCD2-merge batches into one or several tables, via COPY.

Tables merge in parallel (``parallel_workers``), each on its own connection and in its
own transaction, so one failing table does not stop the others; results are per table.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from crawlhub.backends.backend import Backend
from crawlhub.core.configtypes import new_list
from crawlhub.core.errors import SinkError
from crawlhub.core.extras import require
from crawlhub.core.redact import redact_url
from crawlhub.sinks.base import BatchResult, SinkConfig, TableResult
from crawlhub.sinks.pg_table import PgTable, PgTableConfig
from crawlhub.sinks.records import Preparer

log = logging.getLogger(__name__)


class PostgresSinkConfig(SinkConfig):
    """Upsert (or SCD2-merge) records into PostgreSQL tables via COPY into a staging table.

    One table: give ``table`` (and ``columns``, ``types``, ``create``, ``mode``) at the top
    level. Several: list ``tables`` and set ``route_field``, the record field naming the
    table; tables merge in parallel (``parallel_workers``), each in its own transaction.
    """

    type: Literal["postgres"] = "postgres"
    url: str
    tables: list[PgTableConfig] = Field(default_factory=new_list)
    route_field: str | None = None
    parallel_workers: int = Field(default=4, ge=1)
    #: Every run is a full snapshot: rows not delivered get ``deleted_at`` at close.
    full_snapshot: bool = False

    @model_validator(mode="before")
    @classmethod
    def _single_table(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "table" not in data and data.get("tables"):
            # tables inherit the top-level key and hash_exclude they do not set
            inherited = {f: data[f] for f in ("key", "hash_exclude") if f in data}
            tables = [
                {**inherited, **t} if isinstance(t, Mapping) else t for t in data["tables"]
            ]
            return {**data, "tables": tables}
        if not isinstance(data, Mapping) or "table" not in data:
            return data
        data = dict(data)
        if data.get("tables"):
            raise ValueError("give either 'table' (one table) or 'tables' (several), not both")
        table = {"table": data.pop("table")}
        for field in ("columns", "types", "create", "mode"):
            if field in data:
                table[field] = data.pop(field)
        for field in ("key", "hash_exclude"):
            if field in data:
                table[field] = data[field]
        data["tables"] = [table]
        return data

    @model_validator(mode="after")
    def _tables(self) -> PostgresSinkConfig:
        if not self.tables:
            raise ValueError("name the target: 'table: <name>' or a 'tables:' list")
        names = [t.route_name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names repeat: {names}; give each a distinct 'name'")
        if len(self.tables) > 1 and not self.route_field:
            raise ValueError("several tables need 'route_field', the record field naming the table")
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return postgres_dsn(value)


def postgres_dsn(url: str) -> str:
    """A PostgreSQL URL asyncpg accepts: SQLAlchemy's ``postgresql+asyncpg://`` is converted."""
    for prefix in ("postgresql+asyncpg://", "postgresql+psycopg://", "postgres+asyncpg://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


class PostgresSink:
    """Writes records to PostgreSQL tables (see :class:`PgTableConfig` for their layout).

    - ``upsert``: insert new keys, update changed ones (content hash differs), skip the
      rest; counts come from ``RETURNING (xmax = 0)``.
    - ``scd2``: a changed record closes the current version (``valid_to = now()``,
      ``is_current = false``) and adds a new one; unchanged ones are skipped.
    - snapshots (:meth:`begin_snapshot` / :meth:`finish_snapshot`, or
      ``full_snapshot: true``): rows a snapshot did not deliver get ``deleted_at``
      (SCD2: their current version is closed); a row that comes back is undeleted.

    ``write_batch`` groups records by ``route_field`` and merges each group in its own
    transaction. It raises ``SinkError`` when nothing was committed; when only some
    tables failed it returns their records as ``failed`` with ``errors`` and per-table
    results in ``BatchResult.tables``.
    """

    def __init__(self, config: PostgresSinkConfig, *, name: str = "postgres") -> None:
        self.name = name
        self.config = config
        self.tables: dict[str, PgTable] = {t.route_name: PgTable(t, sink=name) for t in config.tables}
        self._pool: Any = None
        self._snapshot: str | None = None
        self._snapshot_broken = False

    async def __aenter__(self) -> PostgresSink:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            await self.abandon_snapshot()
        await self.close()

    # -- lifecycle -----------------------------------------------------------------

    async def open(self) -> None:
        asyncpg = require("asyncpg", "postgres", needed_by=f"sink '{self.name}'")
        dsn = Backend.parse(self.config.url, kinds=("postgres",),
                            what=f"sink '{self.name}'").dsn
        try:
            self._pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=self.config.parallel_workers,
                # Custom plans: a batch's queries are planned for its size and the table's
                # size now; a generic plan cached while the table was small scans it whole.
                server_settings={
                    "client_min_messages": "warning",
                    "plan_cache_mode": "force_custom_plan",
                },
                init=self._init_connection,
            )
        except Exception as exc:
            raise SinkError(
                f"sink '{self.name}': cannot connect to PostgreSQL at "
                f"{redact_url(self.config.url)}: {exc}"
            ) from exc
        try:
            async with self._pool.acquire() as conn:
                for table in self.tables.values():
                    await table.prepare(conn)
                await self._init_connection(conn)  # the pool's first one predates the SQL
        except Exception as exc:
            await self._pool.close()
            self._pool = None
            if isinstance(exc, SinkError):
                raise
            raise SinkError(f"sink '{self.name}': cannot prepare its tables: {exc}") from exc
        if self.config.full_snapshot:
            await self.begin_snapshot()

    async def _init_connection(self, conn: Any) -> None:
        """Give a session its staging tables once (TEMP, so they last as long as it does)."""
        for table in self.tables.values():
            if table.ready:
                await table.ensure_stage(conn)

    async def close(self) -> None:
        if self._pool is None:
            return
        try:
            if self.config.full_snapshot and self._snapshot is not None:
                if self._snapshot_broken:
                    log.warning(
                        "sink %s: a batch failed during snapshot %s; no rows marked deleted",
                        self.name,
                        self._snapshot,
                    )
                else:
                    await self.finish_snapshot()
        finally:
            pool, self._pool = self._pool, None
            await pool.close()

    # -- snapshots -----------------------------------------------------------------

    async def begin_snapshot(self, snapshot_id: str | None = None) -> str:
        """Start a full snapshot: from now on written and unchanged rows are marked seen."""
        self._snapshot = snapshot_id or uuid.uuid4().hex
        self._snapshot_broken = False
        return self._snapshot

    async def finish_snapshot(self, snapshot_id: str | None = None) -> dict[str, int]:
        """Soft-delete rows the snapshot did not see; returns rows deleted per table."""
        snapshot = snapshot_id or self._snapshot
        if snapshot is None:
            raise SinkError(f"sink '{self.name}': finish_snapshot without begin_snapshot")
        pool = self._require_pool()
        deleted: dict[str, int] = {}
        async with pool.acquire() as conn, conn.transaction():
            for name, table in self.tables.items():
                deleted[name] = await table.finish_snapshot(conn, snapshot)
        if snapshot == self._snapshot:
            self._snapshot = None
        log.info("sink %s: snapshot %s finished, deleted %s", self.name, snapshot, deleted)
        return deleted

    async def abandon_snapshot(self) -> None:
        """Forget the current snapshot without deleting anything (failed or cancelled run)."""
        self._snapshot = None

    # -- writing -------------------------------------------------------------------

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        if not records:
            return BatchResult()
        groups, unrouted = self._route(records)
        results = await self.merge(groups) if groups else {}
        result = BatchResult(tables=results, failed=len(unrouted), errors=list(unrouted))
        for table in results.values():
            result.inserted += table.inserted
            result.updated += table.updated
            result.skipped += table.skipped
            result.failed += table.failed
            if table.error:
                result.errors.append(table.error)
        if result.failed:
            self._snapshot_broken = True
            if not any(t.ok for t in results.values()):
                raise SinkError(
                    f"sink '{self.name}': batch of {len(records)} records rolled back: "
                    + "; ".join(result.errors)
                )
        return result

    def _route(self, records: Sequence[dict[str, Any]]) -> tuple[dict[str, list[Any]], list[str]]:
        field = self.config.route_field
        if field is None:
            only = next(iter(self.tables))
            return {only: list(records)}, []
        groups: dict[str, list[Any]] = {}
        unrouted: list[str] = []
        for i, record in enumerate(records):
            target = record.get(field) if isinstance(record, Mapping) else None
            if target is None and len(self.tables) == 1:
                target = next(iter(self.tables))
            if target not in self.tables:
                unrouted.append(
                    f"sink '{self.name}': record {i} has {field}={target!r}, not one of the "
                    f"configured tables {sorted(self.tables)}"
                )
                continue
            groups.setdefault(str(target), []).append(record)
        return groups, unrouted

    async def merge(self, records_by_table: Mapping[str, Sequence[Any]]) -> dict[str, TableResult]:
        """Merge each table's records in its own transaction, ``parallel_workers`` at once.

        A table that fails (bad record, database error) is rolled back and reported in
        its ``TableResult.error``; the other tables are committed.
        """
        unknown = [name for name in records_by_table if name not in self.tables]
        if unknown:
            raise SinkError(
                f"sink '{self.name}': unknown table(s) {unknown}; configured: {sorted(self.tables)}"
            )
        pool = self._require_pool()
        gate = asyncio.Semaphore(self.config.parallel_workers)
        snapshot = self._snapshot

        async def one(name: str, records: Sequence[Any]) -> TableResult:
            table = self.tables[name]
            preparer = Preparer(
                table.spec.key,
                sink=self.name,
                hash_exclude=table.spec.hash_exclude,
                drop=(self.config.route_field,) if self.config.route_field else (),
            )

            async with gate:
                try:
                    async with pool.acquire() as conn:
                        inserted, updated = await table.write(conn, records, snapshot, preparer)
                except Exception as exc:
                    error = f"table {table.spec.table}: {exc}"
                    log.error("sink %s: %d records rolled back, %s", self.name, len(records), error)
                    return TableResult(table.spec.table, failed=len(records), error=error)
            return TableResult(
                table.spec.table,
                inserted=inserted,
                updated=updated,
                skipped=len(records) - inserted - updated,
            )

        names = list(records_by_table)
        results = await asyncio.gather(*(one(n, records_by_table[n]) for n in names))
        return dict(zip(names, results, strict=True))

    def _require_pool(self) -> Any:
        if self._pool is None:
            raise SinkError(f"sink '{self.name}' is not open; call open() first")
        return self._pool


class Scd2Merger(PostgresSink):
    """SCD2-merge several tables in parallel, each in its own transaction (DWD loading).

    ``tables`` are names (key ``key``) or :class:`PgTableConfig` mappings; use as
    ``async with Scd2Merger(url, ["dim_shop", "dim_member"]) as m: await m.merge({...})``.
    """

    def __init__(
        self,
        url: str,
        tables: Sequence[str | Mapping[str, Any] | PgTableConfig],
        *,
        key: Sequence[str] = ("id",),
        parallel_workers: int = 4,
        name: str = "scd2",
    ) -> None:
        specs: list[PgTableConfig] = []
        for table in tables:
            if isinstance(table, PgTableConfig):
                specs.append(table)
            elif isinstance(table, str):
                specs.append(PgTableConfig(table=table, key=list(key), mode="scd2"))
            else:
                specs.append(PgTableConfig.model_validate({"key": list(key), "mode": "scd2", **table}))
        config = PostgresSinkConfig(
            url=url,
            tables=specs,
            route_field="_table",
            parallel_workers=parallel_workers,
            name=name,
        )
        super().__init__(config, name=name)


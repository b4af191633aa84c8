"""What a container job cannot do (the reason to run untrusted project code in one): read
the server's data dir, its ``secret.key`` or another job's run volume; see the host's
processes; outgrow its memory limit (OOM-killed: test_container_jobs) or its process
limit (a fork bomb stops at ``pids``); reach 127.0.0.1 with network ``none`` (with
``host`` it does, so the probe itself works)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from crawlhub.control.jobs import JobService, JobSpec
from tests.containers.engine import py
from tests.helpers import wait_for


def lines(jobs: JobService, run: str) -> list[str]:
    return jobs.sink.text(run, "stdout")  # type: ignore[attr-defined, no-any-return]


async def output(jobs: JobService, spec: JobSpec) -> dict[str, object]:
    """Run ``spec`` (its last stdout line is JSON) to its end; that JSON."""
    await jobs.create(spec)
    run = await jobs.run(spec.name)
    done = await jobs.runner.wait(run.id)
    out = lines(jobs, run.id)
    assert done.status == "succeeded" and out, (done, out)
    return dict(json.loads(out[-1]))


PROBE = """
import json, os, sys
def probe(path):
    try:
        if os.path.isdir(path):
            return sorted(os.listdir(path))
        with open(path, 'rb') as f:
            return f.read().decode()
    except OSError as e:
        return 'denied: ' + type(e).__name__
print(json.dumps({p: probe(p) for p in sys.argv[1:]}))
"""


async def test_a_container_job_cannot_read_the_data_dir_the_secret_key_or_another_runs_volume(
        container_jobs: JobService) -> None:
    runs_dir = container_jobs.runner.runs_dir
    data_dir = runs_dir.parent
    (data_dir / "secret.key").write_text("THE-SERVER-KEY")
    await container_jobs.create(JobSpec(name="neighbour", runtime="container", command=py(
        "import time\nopen('/crawlhub/run/private.txt', 'w').write('NEIGHBOUR-DATA')\n"
        "print('written', flush=True)\ntime.sleep(600)")))
    neighbour = await container_jobs.run("neighbour")
    await wait_for(lambda: "written" in lines(container_jobs, neighbour.id), "the neighbour")
    other_volume = runs_dir / neighbour.id / "private.txt"
    assert other_volume.read_text() == "NEIGHBOUR-DATA"  # there, on the host
    seen = await output(container_jobs, JobSpec(
        name="prying", runtime="container",
        command=["python3", "-c", PROBE, str(data_dir / "secret.key"), str(data_dir),
                 str(other_volume), f"/crawlhub/run/../{neighbour.id}/private.txt",
                 "/crawlhub/run/.."]))
    await container_jobs.cancel("neighbour")
    answers = json.dumps(list(seen.values()))
    assert "THE-SERVER-KEY" not in answers and "NEIGHBOUR-DATA" not in answers, seen
    assert neighbour.id not in answers and "secret.key" not in answers, seen
    assert all(isinstance(v, str) and v.startswith("denied") or v == ["run"]
               for v in seen.values()), seen


async def test_a_container_job_sees_only_its_own_processes(container_jobs: JobService) -> None:
    seen = await output(container_jobs, JobSpec(name="ps", runtime="container", command=py(
        "import json, os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "cmds = [open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace') for p in pids]\n"
        "print(json.dumps({'pids': pids, 'cmds': cmds}))")))
    assert len(seen["pids"]) <= 3, seen  # its init, itself (and a short-lived reader)
    assert not any("pytest" in cmd or "crawlhub" in cmd for cmd in seen["cmds"]), seen  # type: ignore[attr-defined]


async def test_a_fork_bomb_stops_at_the_jobs_pids_limit(container_jobs: JobService) -> None:
    seen = await output(container_jobs, JobSpec(name="bomb", runtime="container", pids=16,
                                                command=py(
        "import json, os, time\nn = 0\nerr = None\nwhile n < 10000:\n    try:\n"
        "        pid = os.fork()\n    except OSError as e:\n        err = e.errno\n        break\n"
        "    if pid == 0:\n        time.sleep(600)\n        os._exit(0)\n    n += 1\n"
        "print(json.dumps({'forked': n, 'errno': err}))")))
    assert seen["errno"] == 11, seen  # EAGAIN: the pids cgroup refused the fork
    assert isinstance(seen["forked"], int) and seen["forked"] < 16, seen


async def test_network_none_cannot_reach_the_hosts_loopback_and_host_can(
        container_jobs: JobService, tmp_path: Path) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HELLO-FROM-HOST\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = ("import json, socket, sys\ntry:\n    s = socket.create_connection(('127.0.0.1',"
             " int(sys.argv[1])), timeout=3)\n    got = s.recv(100).decode()\nexcept OSError as e:\n"
             "    got = 'refused: ' + type(e).__name__\nprint(json.dumps({'got': got}))")
    async with server:
        none = await output(container_jobs, JobSpec(name="offline", runtime="container",
                                                    command=[*py(probe), str(port)]))
        host = await output(container_jobs, JobSpec(name="online", runtime="container",
                                                    network="host", command=[*py(probe), str(port)]))
    assert str(none["got"]).startswith("refused"), none
    assert host["got"] == "HELLO-FROM-HOST\n", host

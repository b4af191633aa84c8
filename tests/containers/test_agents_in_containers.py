"""``crawlhub agent`` in containers (docs/agents-in-containers.md): the agent image built
by ``containers/agent/build.py`` from the local base image, two agents run with the
documented ``podman run`` line on ``--network=host`` against the Redis on 127.0.0.1,
crawling the demo shop (``crawlhub demo``) into the user's output files; one agent
container killed (``podman kill``, SIGKILL) mid-crawl loses no item."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from crawlhub.config import load_config
from crawlhub.demo.site import ITEMS, title
from crawlhub.services import Services
from tests.cli.serving import crawlhub_command
from tests.containers.baseimage import ENGINE
from tests.helpers import wait_for
from tests.queues.conftest import delete_prefix
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "containers" / "agent" / "build.py"
DOC = ROOT / "docs" / "agents-in-containers.md"
ITEM = re.compile(r"^/item/(\d+)$")


@pytest.fixture(scope="session")
def agent_image(base_image: str) -> str:
    """``crawlhub/agent:<version>`` of this tree (rebuilt only when its inputs change)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(BUILD), "--base", base_image, "--json"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        pytest.fail(f"the agent image did not build: {done.stderr[-2000:]}", pytrace=False)
    return str(json.loads(done.stdout)["tag"])


@pytest.fixture
async def demo() -> AsyncIterator[str]:
    """``crawlhub demo`` on a free port of 127.0.0.1, 0.1 s per answer (so a crawl by
    two agents of concurrency 2 lasts long enough to kill one in the middle)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([*crawlhub_command(), "demo", "--port", str(port), "--latency",
                             "0.1", "--items", "0", "--grow-every", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            assert proc.poll() is None, f"crawlhub demo exited {proc.returncode}"
            return False

    try:
        await wait_for(up, "the demo to answer")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def documented_run_line() -> list[str]:
    """The ``podman run`` line of the docs, as argv (its continuation lines joined)."""
    text = DOC.read_text()
    block = re.search(r"```sh\n(podman run .*?)```", text, flags=re.S)
    assert block, f"{DOC} shows no ```sh block starting with podman run"
    return shlex.split(block.group(1).replace("\\\n", " "))


def run_line(name: str, container: str, etc: Path, out: Path, image: str, label: str
             ) -> list[str]:
    """The documented line for agent ``name`` in ``container``: the docs' ``$PWD/etc``
    and ``$PWD/out`` here, the test's label added so nothing outlives it."""
    argv = [arg.replace("$PWD/etc", str(etc)).replace("$PWD/out", str(out))
            .replace("crawlhub-agent-1", container).replace("agent-1", name)
            .replace("crawlhub/agent:0.1.0", image)
            for arg in documented_run_line()]
    return [argv[0], argv[1], "--label", label, *argv[2:]]


def items(out: Path) -> dict[str, list[dict[str, Any]]]:
    """The items in each agent's output file (``out/<agent>/items.jsonl``)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for file in sorted(out.glob("*/items.jsonl")):
        lines = file.read_text().splitlines()
        # a line the killed agent was writing may be cut short; every whole one counts
        found[file.parent.name] = [json.loads(x) for x in lines if x.endswith("}")]
    return found


def engine(*args: str) -> str:
    return subprocess.run([ENGINE, *args], capture_output=True, text=True, check=True,
                          timeout=120).stdout


async def test_two_agent_containers_crawl_the_demo_and_one_killed_mid_crawl_loses_nothing(
        agent_image: str, demo: str, redis_url: str, tmp_path: Path) -> None:
    prefix = f"t-agentc-{uuid.uuid4().hex[:8]}:"
    etc, out = tmp_path / "etc", tmp_path / "out"
    etc.mkdir()
    out.mkdir()
    config = {
        "data_dir": str(tmp_path / "data"),
        "storage": {"queues": redis_url, "state": redis_url, "frontier": redis_url,
                    "agents": redis_url, "redis_prefix": prefix},
        "inbound": [{"name": "http", "class": "http"}],
        "frontier": {"shop": {"segment": "3650d", "exact": True,
                              "key": {"volatile_params": ["utm_*"]}}},
        "outbound": [{"name": "pages", "class": "queue", "frontier": "shop",
                      "init": {"key": "pages"}}],
        "agent": {"concurrency": 2, "lease": 3,
                  "sink": {"type": "jsonl", "path": "items.jsonl", "key": ["url"]}},
    }
    (etc / "crawlhub.yaml").write_text(yaml.safe_dump(config))
    (etc / "extract.yaml").write_text(yaml.safe_dump({
        "fields": {"title": {"css": "h1.title::text"}, "price": {"css": ".price::text"}},
        "links": {"follow": True}}))
    label = f"crawlhub.test={prefix}"
    killed, survivor = (f"crawlhub-{prefix[:-1]}-{n}" for n in (1, 2))
    services = await Services.open(load_config(etc / "crawlhub.yaml"))
    try:
        for name, container in (("agent-1", killed), ("agent-2", survivor)):
            engine(*run_line(name, container, etc, out, agent_image, label)[1:])

        async def both_registered() -> bool:
            return {a.info.host for a in await services.agents.agents()} >= {
                "agent-1", "agent-2"}

        await wait_for(both_registered, "both agent containers registered", timeout=90)  # type: ignore[arg-type]
        await services.hub.submit([{"url": f"{demo}/"}])
        await wait_for(lambda: len(items(out).get("agent-1", [])) >= 5,
                       "agent-1 to write items", timeout=60)
        engine("kill", killed)
        at_kill = sum(len(found) for found in items(out).values())
        queue = services.queues.queue("pages")
        assert await queue.length() or await services.state.pending(), "killed mid-crawl"

        def crawled() -> set[int]:
            return {int(m.group(1)) for found in items(out).values() for item in found
                    if (m := ITEM.match(urlsplit(item["url"]).path))}

        async def done() -> bool:
            return (len(crawled()) == ITEMS and not await queue.length()
                    and not await services.state.pending())

        await wait_for(done, "every item of the shop in the output", timeout=120)  # type: ignore[arg-type]
        assert crawled() == set(range(1, ITEMS + 1))
        by_url = {item["url"]: item for found in items(out).values() for item in found}
        titles = {int(m.group(1)): item["title"] for url, item in by_url.items()
                  if (m := ITEM.match(urlsplit(url).path))}
        assert titles == {n: title(n) for n in range(1, ITEMS + 1)}
        assert at_kill < len(by_url)
        assert len(items(out).get("agent-2", [])) > 0, "the survivor crawled too"
        state = json.loads(engine("inspect", survivor))[0]["State"]
        assert state["Running"], state
        engine("stop", "-t", "20", survivor)  # SIGTERM: it ends cleanly
        state = json.loads(engine("inspect", survivor))[0]["State"]
        assert state["ExitCode"] == 0, engine("logs", survivor)[-2000:]
    finally:
        subprocess.run([ENGINE, "rm", "-f", "-t", "0", *[
            c for c in engine("ps", "-aq", "--filter", f"label={label}").split()]],
            capture_output=True, check=False)
        await services.close()
        await delete_prefix(redis_url, prefix)


def test_the_docs_run_line_runs_the_agent_image_on_the_host_network_read_only() -> None:
    argv = documented_run_line()
    assert argv[:2] == ["podman", "run"]
    assert {"--network=host", "--read-only", "-d"} <= set(argv)
    assert "crawlhub/agent:0.1.0" in argv
    assert argv[argv.index("crawlhub/agent:0.1.0") + 1:argv.index("crawlhub/agent:0.1.0") + 3] \
        == ["-c", "/etc/crawlhub/crawlhub.yaml"]


def test_the_agent_images_dependencies_are_resolved_for_the_bases_python() -> None:
    spec = importlib.util.spec_from_file_location("agent_build", BUILD)
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    names = {d.metadata["Name"].lower() for d in build.runtime_distributions(("redis",), "3.11.2")}
    assert {"redis", "hiredis", "aiohttp", "pydantic", "lxml", "typer"} <= names
    # redis wants async-timeout below 3.11.3: Debian's 3.11.2 needs it, 3.11.7 not
    assert "async-timeout" in names
    newer = {d.metadata["Name"].lower() for d in build.runtime_distributions(("redis",), "3.11.7")}
    assert "async-timeout" not in newer

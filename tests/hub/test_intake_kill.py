"""Frontier-gated intake under SIGKILL: ``crawlhub serve`` killed while clients post
URLs behind a frontier; the clients send their unanswered batches again (same uuids);
after recovery every URL answered routed, duplicate or already_routed is in the queue,
and none is there twice."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from crawlhub.config.loader import load_config
from crawlhub.hub.intake import ALIVE_TTL
from crawlhub.services import Services
from tests.cli.conftest import write_yaml
from tests.cli.serving import crawlhub_serve
from tests.hub.conftest import delete_prefix

pytestmark = pytest.mark.slow

CLIENTS = 4
BATCH = 10
KILL_AFTER = 300


@dataclass
class Storage:
    kind: str
    config: Path


@dataclass
class Posting:
    """What the clients were told, per URL, and the batches left unanswered."""

    told: dict[str, str] = field(default_factory=dict)
    unanswered: list[list[dict[str, Any]]] = field(default_factory=list)


@pytest.fixture(params=["sqlite", "redis"])
def storage(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
            ) -> Iterator[Storage]:
    data_dir = tmp_path / "data"
    config: dict[str, Any] = {
        "data_dir": str(data_dir),
        "frontier": {"web": {"expected_items": 100_000}},
        "outbound": [{"name": "pages", "frontier": "web", "init": {"key": "intake"}}]}
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        config["storage"] = {"queues": url, "state": url, "frontier": url,
                             "redis_prefix": f"{unique_name}:"}
    yield Storage(request.param, write_yaml(tmp_path / "hub.yaml", config))
    if request.param == "redis":
        asyncio.run(delete_prefix(request.getfixturevalue("redis_url"), f"{unique_name}:"))


def batch_of(client: int, n: int) -> list[dict[str, Any]]:
    return [{"url": f"http://site/{client}/{n + k}", "task_uuid": f"c{client}-{n + k}"}
            for k in range(BATCH)]


async def post_until_dead(url: str, client: int, posting: Posting) -> None:
    n = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while True:
            body = batch_of(client, n)
            # every third batch repeats the previous one's URLs under new uuids
            if n and n % (3 * BATCH) == 0:
                body += [{"url": t["url"], "task_uuid": f"again-{t['task_uuid']}"}
                         for t in batch_of(client, n - BATCH)]
            try:
                async with session.post(f"{url}/task/", json=body) as resp:
                    answer = await resp.json()
            except (TimeoutError, aiohttp.ClientError):
                posting.unanswered.append(body)
                return
            for task, result in zip(body, answer["tasks"], strict=True):
                posting.told.setdefault(task["url"], result["status"])
            n += BATCH


async def test_no_url_answered_is_lost_when_the_server_is_killed(
        storage: Storage, tmp_path: Path) -> None:
    posting = Posting()
    with crawlhub_serve(["-c", str(storage.config)], log=tmp_path / "serve.log") as served:
        clients = [asyncio.create_task(post_until_dead(served.url, i, posting))
                   for i in range(CLIENTS)]
        deadline = time.monotonic() + 120
        while sum(s == "routed" for s in posting.told.values()) < KILL_AFTER:
            assert time.monotonic() < deadline, served.output()
            assert not any(c.done() for c in clients), served.output()
            await asyncio.sleep(0.01)
        served.proc.send_signal(signal.SIGKILL)
        await asyncio.gather(*clients)
        await asyncio.to_thread(served.proc.wait, 30)
    assert set(posting.told.values()) <= {"routed", "duplicate"}

    svc = await Services.open(load_config(storage.config))
    try:
        # The clients send what was not answered again: same uuids, same URLs.
        for body in posting.unanswered:
            for task, result in zip(body, await svc.hub.submit(body), strict=True):
                assert result.status in ("routed", "duplicate", "already_routed")
                posting.told.setdefault(task["url"], result.status)
        await svc.hub.recover_intake(time.time() + ALIVE_TTL + 1)
        queue = svc.queues.queue("intake")
        messages = await queue.lease(100_000, 600)
        queued = Counter(m.payload["url"] for m in messages)
    finally:
        await svc.close()
    lost = set(posting.told) - set(queued)
    assert not lost, f"{len(lost)} URLs answered but in no queue, e.g. {sorted(lost)[:3]}"
    doubled = {u: n for u, n in queued.items() if n > 1}
    assert not doubled, f"{len(doubled)} URLs queued twice, e.g. {sorted(doubled)[:3]}"

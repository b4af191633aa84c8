"""No accepted task is lost: ``crawlhub serve`` killed with SIGKILL while clients post
tasks still has, in its queue and ledger, every task it answered 200 for; restarted on
the same data it serves that queue."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from crawlhub.core.keys import hub_keys
from crawlhub.hub.state import open_state
from crawlhub.queues import open_backend
from tests.cli.conftest import write_yaml
from tests.cli.serving import Served, crawlhub_serve
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

CLIENTS = 4
#: Kill the server once this many tasks were accepted (clients keep posting meanwhile).
KILL_AFTER = 400


@dataclass
class Storage:
    config: Path
    queues: str
    state: str
    prefix: str


@pytest.fixture(params=["sqlite", "redis"])
def storage(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
            ) -> Iterator[Storage]:
    data_dir = tmp_path / "data"
    outbound = [{"name": "default", "init": {"key": "intake"}}]
    if request.param == "sqlite":
        config = write_yaml(tmp_path / "hub.yaml", {"data_dir": str(data_dir),
                                                    "outbound": outbound})
        yield Storage(config, f"sqlite:///{data_dir}/queues.db",
                      f"sqlite:///{data_dir}/hub.db", "crawlhub:")
        return
    url = request.getfixturevalue("redis_url")
    prefix = f"{unique_name}:"
    config = write_yaml(tmp_path / "hub.yaml", {
        "data_dir": str(data_dir), "outbound": outbound,
        "storage": {"queues": url, "state": url, "redis_prefix": prefix}})
    yield Storage(config, url, url, prefix)
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=500))
    if keys:
        client.delete(*keys)
    client.close()


async def post_until_dead(url: str, client: int, accepted: set[str],
                          refused: list[int]) -> None:
    """Post tasks (even clients one at a time, odd ones in lists of 10) until the server
    stops answering; record the uuid of every task answered 200 and routed, and the
    status of any other answer."""
    n = 0
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            body: Any = ({"client": client, "n": n} if client % 2 == 0 else
                         [{"client": client, "n": n + k} for k in range(10)])
            try:
                async with session.post(f"{url}/task/", json=body) as resp:
                    if resp.status != 200:
                        refused.append(resp.status)
                        return
                    answer = await resp.json()
            except (TimeoutError, aiohttp.ClientError):
                return
            results = answer["tasks"] if isinstance(answer, dict) and "tasks" in answer \
                else [answer]
            accepted.update(r["task_uuid"] for r in results if r["status"] == "routed")
            n += len(results)


async def crash_while_posting(served: Served) -> set[str]:
    accepted: set[str] = set()
    refused: list[int] = []
    clients = [asyncio.create_task(post_until_dead(served.url, i, accepted, refused))
               for i in range(CLIENTS)]

    def enough_accepted() -> bool:
        assert not any(c.done() for c in clients), served.output()
        return len(accepted) >= KILL_AFTER

    await wait_for(enough_accepted, f"{KILL_AFTER} accepted tasks", timeout=120, every=0.01)
    served.proc.send_signal(signal.SIGKILL)
    await asyncio.gather(*clients)
    await asyncio.to_thread(served.proc.wait, 30)
    assert served.proc.returncode == -signal.SIGKILL
    assert refused == []
    return accepted


async def queued_uuids(storage: Storage) -> set[str]:
    """Every task uuid in the queue, read by leasing all and handing them back."""
    backend = open_backend(storage.queues, prefix=storage.prefix)
    try:
        queue = backend.queue("intake")
        messages = await queue.lease(100_000, 600)
        await queue.nack([m.id for m in messages])
        return {m.payload["task_uuid"] for m in messages}
    finally:
        await backend.close()


def unpushed_uuids(storage: Storage) -> set[str]:
    """The tasks the killed process recorded and had not marked pushed: the restarted
    hub's recovery pushes them once the dead process's last heartbeat is ALIVE_TTL old
    (those a SQLite queue already holds are only marked pushed)."""
    if storage.state.startswith("sqlite:///"):
        path = storage.state.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as conn:
            return {u for (u,) in conn.execute("SELECT task_uuid FROM unpushed")}
    client = redis.Redis.from_url(storage.state)
    try:
        return {u.decode() for u in client.zrange(hub_keys(storage.prefix)["unpushed"], 0, -1)}
    finally:
        client.close()


async def ledger_misses(storage: Storage, uuids: set[str]) -> set[str]:
    state = open_state(storage.state, prefix=storage.prefix)
    try:
        return {u for u in uuids if await state.get(u) is None}
    finally:
        await state.close()


async def test_every_task_answered_200_survives_a_sigkill_of_the_server(
        storage: Storage, tmp_path: Path) -> None:
    with crawlhub_serve(["-c", str(storage.config)], log=tmp_path / "serve.log") as served:
        accepted = await crash_while_posting(served)

    queued = await queued_uuids(storage)
    assert accepted <= queued, f"{len(accepted - queued)} accepted tasks lost"
    assert await ledger_misses(storage, accepted) == set()
    # what the queue holds once the restarted hub's recovery has run (it runs when the
    # killed process has been silent ALIVE_TTL seconds, which a slow restart may pass)
    expected = queued | unpushed_uuids(storage)

    with crawlhub_serve(["-c", str(storage.config)], log=tmp_path / "restart.log") as served:
        async with aiohttp.ClientSession() as session:
            async def recovered() -> dict[str, Any] | None:
                async with session.get(f"{served.url}/queues/") as resp:
                    [stats] = [q for q in await resp.json() if q["name"] == "intake"]
                return stats if stats["left"] >= len(expected) else None

            stats = await wait_for(recovered, "the killed process's unpushed tasks pushed")
            assert stats["left"] == stats["ready"] == len(expected)
            async with session.post(f"{served.url}/queues/intake/lease",
                                    json={"n": 10_000}) as resp:
                served_again = {m["payload"]["task_uuid"] for m in await resp.json()}
            assert served_again == expected
            async with session.post(f"{served.url}/task/", json={"after": "restart"}) as resp:
                assert resp.status == 200

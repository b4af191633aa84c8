"""``GET /center/jobs/`` and the center's agents in ``GET /agents/``: a center run by the
services (``center.url``: real Redis, or in process), an agent and a job on its bus; 409
without a center."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from crawlhub.center import CenterClient, CenterWorker, open_bus
from tests.agents.servers import Site
from tests.api.conftest import MakeApi
from tests.helpers import wait_for


async def test_no_center_is_a_409_with_a_json_body(make_api: MakeApi) -> None:
    api = await make_api()
    response = await api.client.get("/center/jobs/")
    assert response.status_code == 409
    assert "center.url" in response.json()["detail"]


async def test_center_jobs_and_agents_show_the_allocation_and_its_counters(
        make_api: MakeApi, backend: str, request: pytest.FixtureRequest,
        unique_name: str) -> None:
    # the center's messages on real Redis Streams beside the Redis backend (under the
    # server's key prefix), in process beside SQLite
    url = (request.getfixturevalue("redis_url") if backend == "redis"
           else f"memory://{uuid.uuid4().hex}")
    prefix = f"{unique_name}:"
    api = await make_api(center={"url": url})
    assert api.svc.config.storage.redis_prefix == prefix or backend != "redis"
    await api.svc.start()  # runs the center
    stop = asyncio.Event()
    worker = CenterWorker(open_bus(url, prefix=prefix), "agent-1", beat_every=0.1)
    running = asyncio.create_task(worker.run(stop))
    try:
        async with Site(pages=20) as site:
            async def live() -> bool:
                rows = (await api.client.get("/agents/")).json()["agents"]
                return any(r["agent_id"] == "agent-1" and r["alive"] for r in rows)

            await wait_for(live, "the agent listed alive")
            async with CenterClient(open_bus(url, prefix=prefix), "job-api", strategy="fixed", agents=1,
                                    stats_every=0.05) as client:
                for n in range(5):
                    assert (await client.fetch(f"{site.url}/page/{n}")).ok

                async def reported() -> dict | None:  # type: ignore[type-arg]
                    jobs = (await api.client.get("/center/jobs/")).json()["jobs"]
                    return next((j for j in jobs if j["returned"] == 5), None)

                job = await wait_for(reported, "the job's counters reported")
                assert job["job"] == "job-api" and job["strategy"] == "fixed"
                assert job["agents"] == ["agent-1"] and job["sent"] == 5
                assert job["in_flight"] == 0 and job["failed"] == 0

                async def allocated() -> bool:
                    rows = (await api.client.get("/agents/")).json()["agents"]
                    return any(r["agent_id"] == "agent-1" and r["jobs"] == ["job-api"]
                               for r in rows)

                await wait_for(allocated, "the agent's allocated job listed")
        jobs = (await api.client.get("/center/jobs/")).json()["jobs"]
        assert jobs == []  # released when the job closed
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 10)
        await worker.bus.close()

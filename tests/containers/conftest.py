"""Fixtures of the container tests: the local base image (built once, see
``baseimage.py``) and a JobService whose runner runs jobs in containers of the real
engine. Where no engine can run, every test here fails saying why - never a silent skip."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.control.channel import ControlChannel
from crawlhub.control.db import ControlDB
from crawlhub.control.jobs import JobService, JobStore, Runner
from crawlhub.control.jobs.container import ContainerRuntime
from tests.containers.baseimage import NoEngine, ensure_base_image
from tests.containers.engine import Sink


@pytest.fixture(scope="session")
def base_image() -> str:
    try:
        return ensure_base_image()
    except NoEngine as exc:
        pytest.fail(f"the container tests need a container engine: {exc}", pytrace=False)


@pytest.fixture
async def container_jobs(tmp_path: Path, base_image: str) -> AsyncIterator[JobService]:
    """Jobs on SQLite whose runs are containers of ``base_image`` by default (grace 2 s);
    ``.sink`` holds their log lines."""
    db = await ControlDB.open(f"sqlite:///{tmp_path}/control.db")
    channel = ControlChannel(db)
    await channel.open()
    sink = Sink()
    runs = tmp_path / "runs"
    runtime = ContainerRuntime(default_image=base_image, env_dir=runs)
    runner = Runner(JobStore(db), channel=channel, runs_dir=runs, grace=2.0, beat=0.2,
                    log_sink=sink, runtime="container", runtimes={"container": runtime})
    service = JobService(runner.store, runner)
    service.sink = sink  # type: ignore[attr-defined]
    await service.open()
    try:
        yield service
    finally:
        await service.close()
        await channel.close()
        await db.close()

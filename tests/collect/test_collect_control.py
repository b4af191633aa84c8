"""A collection run under a job's control: paused it sends no request and keeps its lease,
continued it finishes with every item; exit ends it like Ctrl-C (CANCELLED, what was
delivered written, progress saved) and the next run resumes; counters reach the file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub import sdk
from crawlhub.collect.service import CollectJobManager
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core import jobprotocol as protocol
from tests.collect.conftest import LazyItems, job_config
from tests.httpapi import ApiServer, Fault


def news_config(tmp_path: Path, url: str) -> CrawlhubConfig:
    """One job, ``news``, on the test API, writing to ``news.jsonl`` (keyed by id)."""
    job = job_config(url, strategy={"filter_days": None}).model_dump(mode="json")
    job["sink"] = {"type": "jsonl", "path": str(tmp_path / "news.jsonl")}
    return CrawlhubConfig.model_validate({"data_dir": str(tmp_path), "jobs": [job]})


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer(items=LazyItems(900)) as server:  # type: ignore[arg-type]
        server.inject(Fault.slow(0.05), times=None)  # ~20 requests a second
        yield server


@pytest.fixture
async def manager(tmp_path: Path, api: ApiServer) -> AsyncIterator[CollectJobManager]:
    m = CollectJobManager(news_config(tmp_path, api.url))
    yield m
    await m.close()


async def test_a_paused_run_sends_nothing_and_finishes_every_item_once_continued(
        manager: CollectJobManager, api: ApiServer, tmp_path: Path) -> None:
    control = sdk.Manual()
    counters = sdk.Counters(tmp_path / "counters.json")
    await manager.start("news", control=control, counters=counters)
    await api.wait_for_requests(3)
    control.set("pause")
    await asyncio.sleep(0.6)  # the pause lands, the request in flight is delivered
    sent = len(api.log)
    await asyncio.sleep(0.8)
    assert len(api.log) == sent, "requests were sent while paused"
    status = await manager.status("news")
    assert status["state"] == "running" and status["progress"]["paused"] is True
    assert sent < 10  # the total and 9 batches: it was not done
    control.set("run")
    result = await asyncio.wait_for(manager.wait("news"), 30)
    assert result is not None and result.status.value == "SUCCEEDED"
    assert lines(tmp_path / "news.jsonl") == 900
    saved = (protocol.read_json(tmp_path / "counters.json") or {})["counters"]
    assert saved["items"] == 900 and saved["requests"] == 10 and saved["errors"] == 0


async def test_exit_cancels_the_run_keeping_what_was_delivered_and_the_next_run_resumes(
        manager: CollectJobManager, api: ApiServer, tmp_path: Path) -> None:
    control = sdk.Manual()
    await manager.start("news", control=control)
    await api.wait_for_requests(4)
    control.set("exit")
    result = await asyncio.wait_for(manager.wait("news"), 30)
    assert result is not None and result.status.value == "CANCELLED"
    assert result.reason is not None and "exit requested" in result.reason
    delivered = lines(tmp_path / "news.jsonl")
    assert 0 < delivered < 900 and delivered % 100 == 0  # whole batches, none half
    status = await manager.status("news")
    assert status["saved"]["saved_offset"] is not None
    await manager.start("news")
    again = await asyncio.wait_for(manager.wait("news"), 30)
    assert again is not None and again.status.value == "SUCCEEDED"
    assert lines(tmp_path / "news.jsonl") == 900

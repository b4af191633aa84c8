"""The log service of one process: writes cleaned and masked, the logging handler, live
tails, retention, and the distributed set-up from a config (real SQLite and Redis)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.control.db import ControlDB
from crawlhub.control.logs import LogLine, LogQuery, LogService, LogStore, open_log_store
from crawlhub.control.logs.handler import LogShipper, record_line, source_of
from crawlhub.control.logs.transport import DirectTransport, RedisTransport
from tests.control.logs.conftest import MakeLine, messages


@pytest.fixture
async def service(store: LogStore) -> AsyncIterator[LogService]:
    logs = LogService(store, DirectTransport(store, interval=0.02), poll=0.05)
    await logs.start(prune=False, ship=False)
    yield logs
    await logs.transport.close()


# -- writing ----------------------------------------------------------------------------
async def test_written_lines_are_cleaned_and_their_secrets_masked(service: LogService
                                                                  ) -> None:
    await service.write([LogLine(ts=1.0, message="connect redis://:hunter2@db:6379/0"
                                 " https://x/?token=abc&page=2 https://y/?sign=s3cr3t\x00",
                                 level="WARN", job="j", run="r", task="t")])
    await service.flush()
    [line] = (await service.search(LogQuery())).lines
    assert "hunter2" not in line.message and "s3cr3t" not in line.message
    assert "redis://:***@db:6379/0" in line.message and "\x00" not in line.message
    assert (line.level, line.job, line.run, line.task) == ("warning", "j", "r", "t")
    assert "?token=***&page=2" in line.message and "abc" not in line.message
    assert line.host  # this host's name, when the line names none


async def test_emit_from_another_thread(service: LogService) -> None:
    thread = threading.Thread(target=service.emit, args=("from a thread",),
                              kwargs={"job": "j", "source": "build", "level": "error"})
    thread.start()
    thread.join()
    await service.flush()
    [line] = (await service.search(LogQuery(job="j"))).lines
    assert (line.message, line.source, line.level) == ("from a thread", "build", "error")
    assert line.host  # this host's name


# -- the logging handler ----------------------------------------------------------------
def test_loggers_map_to_sources() -> None:
    assert source_of("crawlhub.agents.agent") == "agent"
    assert source_of("crawlhub.collect.run") == "collector"
    assert source_of("crawlhub.job") == "collector"
    assert source_of("crawlhub.center.worker") == "center"
    assert source_of("crawlhub.control.runner") == "control"
    assert source_of("crawlhub.hub") == "hub" and source_of("crawlhub.agentsx") == "hub"


def test_a_record_carries_its_codes_and_its_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("crawlhub.hub").makeRecord(
            "crawlhub.hub", logging.ERROR, __file__, 1, "task %s failed", ("t1",),
            exc_info=__import__("sys").exc_info(), extra={"job": "j", "run": 7,
                                                        "task_uuid": "u-1"})
    line = record_line(record, "h")
    assert line.message.startswith("task t1 failed\nTraceback")
    assert "ValueError: boom" in line.message
    assert (line.level, line.source, line.job, line.run, line.task, line.host) == (
        "error", "hub", "j", "7", "u-1", "h")


def test_the_handler_masks_secrets_and_never_recurses(unique_name: str) -> None:
    shipped: list[LogLine] = []
    logger = logging.getLogger(f"crawlhub.agents.{unique_name}")

    def put(lines: list[LogLine]) -> None:
        shipped.extend(lines)
        logger.warning("logged while shipping")  # would recurse forever

    handler = LogShipper(put)
    logger.addHandler(handler)
    try:
        logger.warning("proxy http://user:pa55@proxy:8080 refused", extra={"job": "j"})
    finally:
        logger.removeHandler(handler)
    assert [x.message for x in shipped] == ["proxy http://user:***@proxy:8080 refused"]
    assert shipped[0].source == "agent" and shipped[0].job == "j"
    assert handler.shipped == 1


def test_the_handler_never_raises_into_the_caller(unique_name: str) -> None:
    def put(lines: list[LogLine]) -> None:
        raise RuntimeError("transport broken")

    name = f"crawlhub.hub.{unique_name}"
    logger = logging.getLogger(name)
    handler = LogShipper(put)
    logger.addHandler(handler)
    try:
        logger.error("still fine")
    finally:
        logger.removeHandler(handler)
    bad = logger.makeRecord(name, logging.ERROR, __file__, 1, "bad format %d", ("x",), None)
    handler.handle(bad)  # a broken record: counted, not raised
    assert handler.failed == 2 and handler.shipped == 0


async def test_the_installed_handler_ships_crawlhub_records_to_the_store(
        service: LogService, unique_name: str) -> None:
    service.install_handler()
    logging.getLogger(f"crawlhub.center.{unique_name}").warning(
        "agent %s silent", "a1", extra={"job": "crawl-news"})
    logging.getLogger(f"other.{unique_name}").warning("not ours")
    await service.flush()
    found = (await service.search(LogQuery(q="silent"))).lines
    assert [(x.message, x.source, x.job) for x in found] == [
        ("agent a1 silent", "center", "crawl-news")]
    assert not (await service.search(LogQuery(q="ours"))).lines
    await service.close()
    assert not any(isinstance(h, LogShipper) for h in logging.getLogger("crawlhub").handlers)


# -- tails ------------------------------------------------------------------------------
def tail_started(logs: LogService, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set once a tail of ``logs`` has read where it starts (the store's last id), so a
    test writes its "new" lines after that, however slow the machine."""
    started = asyncio.Event()
    last_id = logs.store.last_id

    async def spied() -> int:
        top = await last_id()
        started.set()
        return top

    monkeypatch.setattr(logs.store, "last_id", spied)
    return started


async def test_a_tail_gets_the_lines_written_after_it_started(
        service: LogService, line: MakeLine, monkeypatch: pytest.MonkeyPatch) -> None:
    await service.write([line("before", job="j")])
    await service.flush()
    started = tail_started(service, monkeypatch)
    got: list[str] = []

    async def follow() -> None:
        async for x in service.tail(LogQuery(job="j", q="-skip")):
            got.append(x.message)
            if len(got) == 3:
                return

    task = asyncio.create_task(follow())
    await asyncio.wait_for(started.wait(), 5)  # the tail starts at the newest id
    await service.write([line("one", job="j"), line("other job", job="k"),
                         line("skip me", job="j")])
    await service.write([line("two", job="j")])
    await asyncio.sleep(0.05)
    await service.write([line("three", job="j")])
    await asyncio.wait_for(task, 5)
    assert got == ["one", "two", "three"]


async def test_a_tail_sees_lines_other_processes_write(
        store: LogStore, service: LogService, line: MakeLine, tmp_path: Path) -> None:
    other = open_log_store(await ControlDB.open(f"sqlite:///{tmp_path}/logs.db"))
    try:
        start = await store.last_id()
        waiting = asyncio.create_task(service.wait_lines(LogQuery(), start, 5.0))
        await asyncio.sleep(0.1)
        await other.write([line("from elsewhere")])  # no notice reaches this process
        assert [x.message for x in await waiting] == ["from elsewhere"]
    finally:
        await other.close()


async def test_waiting_for_lines_gives_up_after_the_timeout(service: LogService) -> None:
    began = time.monotonic()
    assert await service.wait_lines(LogQuery(), 0, 0.15) == []
    assert time.monotonic() - began >= 0.15


# -- retention --------------------------------------------------------------------------
async def test_the_pruner_applies_the_retention_when_started(store: LogStore,
                                                             line: MakeLine) -> None:
    await store.write([line("ancient", ts=time.time() - 1000), line("recent")])
    logs = LogService(store, max_age=100.0, max_lines=None, prune_every=3600)
    await logs.start(ship=False)
    try:
        for _ in range(100):
            if logs.pruned:
                break
            await asyncio.sleep(0.02)
        assert logs.pruned == 1
        assert [x.message for x in (await store.search(LogQuery())).lines] == ["recent"]
    finally:
        await logs.transport.close()


# -- from a config ----------------------------------------------------------------------
async def test_embedded_config_writes_directly(tmp_path: Path, line: MakeLine) -> None:
    config = CrawlhubConfig.model_validate({"data_dir": str(tmp_path)})
    logs = await LogService.open(config)
    try:
        assert isinstance(logs.transport, DirectTransport) and logs.collector is None
        await logs.start(prune=False, ship=False)
        await logs.write([line("embedded")])
        await logs.flush()
        assert await messages(logs) == ["embedded"]
        assert (tmp_path / "logs.db").exists()
    finally:
        await logs.close()


async def test_distributed_config_goes_through_redis_to_a_collector(
        tmp_path: Path, redis_url: str, unique_name: str, line: MakeLine,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "storage": {"redis_prefix": f"{unique_name}:"},
        "control": {"channel": redis_url}})
    producer = await LogService.open(config)  # an agent: writes, collects nothing
    server = await LogService.open(config)  # crawlhub serve: collects
    try:
        assert isinstance(producer.transport, RedisTransport)
        assert producer.transport.key == f"{unique_name}:logs:stream"
        await producer.start(collect=False, prune=False, ship=False)
        await server.start(prune=False, ship=False)
        started = tail_started(server, monkeypatch)
        lines = server.tail(LogQuery(job="dist"))
        first = asyncio.ensure_future(lines.__anext__())
        await asyncio.wait_for(started.wait(), 5)
        await producer.write([line("through the stream", job="dist", run="r9")])
        got = await asyncio.wait_for(first, 5)
        assert (got.message, got.run) == ("through the stream", "r9")
        await lines.aclose()
    finally:
        await producer.close()
        await server.close()
        client = aioredis.Redis.from_url(redis_url)
        await client.delete(f"{unique_name}:logs:stream")
        await client.aclose()

"""The control channel: each job's desired state stored on SQLite and PostgreSQL,
announced in process and over real Redis pub/sub, watched through broker outages, and
mirrored into a run's control file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.backends.redis import redis_client
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.control.channel import (
    ControlChannel,
    ControlError,
    ControlFileWriter,
    ControlFollower,
    RedisNotifier,
    open_channel,
)
from crawlhub.control.db import ControlDB
from crawlhub.control.plane import ControlPlane
from crawlhub.core import jobprotocol as protocol
from tests.helpers import wait_for
from tests.servers import throwaway_valkey

ODD_NAMES = ["a b", "ç/ü", "*", "job?[1]", "{x}:y", "'; DROP TABLE x; --", "😀" * 50,
             "control:*", "x" * 200]


async def next_state(watch: AsyncIterator[str], timeout: float = 10.0) -> str:
    return await asyncio.wait_for(anext(watch), timeout)


@pytest.fixture(params=["memory", "redis"])
async def channel(request: pytest.FixtureRequest, control_db: ControlDB, unique_name: str
                  ) -> AsyncIterator[ControlChannel]:
    """A channel on each database, in process or on the test Redis (a prefix of its own)."""
    notifier = None
    if request.param == "redis":
        notifier = RedisNotifier(request.getfixturevalue("redis_url"),
                                 prefix=f"{unique_name}:")
    chan = ControlChannel(control_db, notifier)
    await chan.open()
    yield chan
    await chan.close()


async def test_a_job_never_set_runs(channel: ControlChannel) -> None:
    assert await channel.get("nightly") == "run"


async def test_a_state_set_is_stored_and_survives_reopening_the_database(
        control_db: ControlDB) -> None:
    first = ControlChannel(control_db)
    await first.open()
    await first.set("nightly", "pause")
    await first.set("hourly", "exit")
    reopened_db = await ControlDB.open(control_db.url, prefix=control_db.prefix)
    try:
        again = ControlChannel(reopened_db)
        await again.open()
        assert await again.get("nightly") == "pause"
        assert await again.get("hourly") == "exit"
        assert {j: s.state for j, s in (await again.states()).items()} == {
            "nightly": "pause", "hourly": "exit"}
    finally:
        await reopened_db.close()


async def test_an_unknown_state_is_refused_naming_the_states_and_nothing_is_stored(
        channel: ControlChannel) -> None:
    for bad in ("stop", "PAUSE", "", None, 1):
        with pytest.raises(ControlError, match="run, pause, exit"):
            await channel.set("nightly", bad)  # type: ignore[arg-type]
    assert await channel.get("nightly") == "run"
    assert await channel.states() == {}


async def test_job_names_with_odd_characters_are_kept_apart(channel: ControlChannel) -> None:
    for i, name in enumerate(ODD_NAMES):
        await channel.set(name, protocol.STATES[i % 3])
    for i, name in enumerate(ODD_NAMES):
        assert await channel.get(name) == protocol.STATES[i % 3], name
    # a glob character in a name does not make its watcher hear other jobs
    watch = channel.watch("job*")
    assert await next_state(watch) == "run"
    await channel.set("job-a", "pause")
    await channel.set("job*", "pause")
    assert await next_state(watch) == "pause"
    await watch.aclose()  # type: ignore[attr-defined]


async def test_bad_job_names_are_refused(channel: ControlChannel) -> None:
    for bad in ("", "a\x00b", "line\nbreak", "x" * 201, None):
        with pytest.raises(ControlError, match="job name"):
            await channel.set(bad, "pause")  # type: ignore[arg-type]
        with pytest.raises(ControlError, match="job name"):
            await channel.get(bad)  # type: ignore[arg-type]


async def test_watch_yields_the_state_at_once_then_each_change_once(
        channel: ControlChannel) -> None:
    await channel.set("nightly", "pause")
    watch = channel.watch("nightly")
    assert await next_state(watch) == "pause"
    await channel.set("nightly", "pause")  # the same state again: nothing new
    await channel.set("nightly", "run")
    assert await next_state(watch) == "run"
    await channel.set("nightly", "exit")
    assert await next_state(watch) == "exit"
    await watch.aclose()  # type: ignore[attr-defined]


async def test_changes_never_go_back_in_time_when_the_clock_does(
        control_db: ControlDB, monkeypatch: pytest.MonkeyPatch) -> None:
    chan = ControlChannel(control_db)
    await chan.open()
    first = await chan.set("nightly", "pause")
    monkeypatch.setattr("crawlhub.control.channel.time.time", lambda: first.changed_at - 3600)
    second = await chan.set("nightly", "run")
    assert second.changed_at > first.changed_at
    assert await chan.get("nightly") == "run"


async def test_a_change_in_another_process_arrives_over_redis_before_any_reread(
        control_db: ControlDB, redis_url: str, unique_name: str) -> None:
    # two channels = two processes: one database, one Redis; the watcher re-reads the
    # database only every minute, so only the announcement can bring the change
    setter = ControlChannel(control_db, RedisNotifier(redis_url, prefix=f"{unique_name}:"))
    watcher = ControlChannel(control_db, RedisNotifier(redis_url, prefix=f"{unique_name}:"),
                             reread=60)
    await setter.open()
    try:
        watch = watcher.watch("nightly")
        assert await next_state(watch) == "run"
        await asyncio.sleep(0.3)  # the subscription is made in the background
        await setter.set("nightly", "pause")
        assert await next_state(watch, timeout=5) == "pause"
        await setter.set("nightly", "run")
        assert await next_state(watch, timeout=5) == "run"
        await watch.aclose()  # type: ignore[attr-defined]
    finally:
        await setter.close()
        await watcher.close()


async def test_each_job_has_its_own_redis_channel_carrying_the_change(
        tmp_path: Path, redis_url: str, unique_name: str) -> None:
    """Another tool may subscribe to ``<storage.redis_prefix>control:<job>``."""
    config = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "storage": {"redis_prefix": f"{unique_name}:"},
        "control": {"channel": redis_url}})
    db = await ControlDB.open(f"sqlite:///{tmp_path}/control.db")
    chan = await open_channel(config, db)
    client = redis_client(redis_url, name="test")
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        assert chan.distributed
        await pubsub.subscribe(f"{unique_name}:control:night ly")
        await chan.set("night ly", "pause")
        message = await wait_for(lambda: pubsub.get_message(timeout=0.5), "the announcement")
        data = json.loads(message["data"])
        assert data["job"] == "night ly" and data["state"] == "pause"
        assert data["changed_at"] == (await chan.read("night ly")).changed_at
    finally:
        await pubsub.aclose()
        await client.aclose()
        await chan.close()
        await db.close()


async def test_a_watch_outlives_a_redis_outage_and_catches_up_when_it_returns(
        control_db: ControlDB) -> None:
    with throwaway_valkey() as server:
        setter = ControlChannel(control_db, RedisNotifier(server.url, prefix="t:"))
        # no periodic re-read: only the resubscription after the outage can catch up
        watcher = ControlChannel(control_db, RedisNotifier(server.url, prefix="t:"),
                                 reread=60)
        await setter.open()
        try:
            watch = watcher.watch("nightly")
            assert await next_state(watch) == "run"
            missed = asyncio.ensure_future(anext(watch))
            await asyncio.sleep(0.3)  # subscribed (and the state read again: still run)
            server.stop()
            # stored, and the announcement fails: logged, not raised
            await setter.set("nightly", "pause")
            await asyncio.sleep(1.0)
            assert not missed.done()  # the watch waits; it did not raise either
            server.start()
            assert await asyncio.wait_for(missed, 15) == "pause"
            await setter.set("nightly", "run")  # and announcements flow again
            assert await next_state(watch, timeout=5) == "run"
            await watch.aclose()  # type: ignore[attr-defined]
        finally:
            await setter.close()
            await watcher.close()


async def test_the_periodic_reread_brings_a_change_while_redis_stays_down(
        control_db: ControlDB) -> None:
    with throwaway_valkey() as server:
        chan = ControlChannel(control_db, RedisNotifier(server.url, prefix="t:"), reread=0.3)
        other = ControlChannel(control_db)  # another process, writing only to the database
        await other.open()
        try:
            server.stop()
            watch = chan.watch("nightly")
            assert await next_state(watch) == "run"
            await other.set("nightly", "pause")
            assert await next_state(watch, timeout=5) == "pause"
            await watch.aclose()  # type: ignore[attr-defined]
        finally:
            await chan.close()


async def test_the_control_file_holds_the_state_before_the_run_starts_and_follows_it(
        channel: ControlChannel, tmp_path: Path) -> None:
    path = tmp_path / "run-1" / "control.json"
    path.parent.mkdir()
    await channel.set("nightly", "pause")
    async with ControlFileWriter(channel, "nightly", path) as writer:
        data = protocol.read_json(path)
        assert data["state"] == "pause" and isinstance(data["changed_at"], float)
        assert writer.state == "pause"
        await channel.set("nightly", "run")
        await wait_for(lambda: (protocol.read_json(path) or {}).get("state") == "run",
                       "the file to say run")
        await channel.set("nightly", "exit")
        await wait_for(lambda: (protocol.read_json(path) or {}).get("state") == "exit",
                       "the file to say exit")
    await channel.set("nightly", "run")  # after the run: the file is left alone
    await asyncio.sleep(0.2)
    assert protocol.read_json(path)["state"] == "exit"


async def test_an_in_process_run_reads_the_same_state_through_a_control(
        channel: ControlChannel) -> None:
    async with ControlFollower(channel, "nightly") as follower:
        control = follower.control
        assert control.running
        await channel.set("nightly", "pause")
        await wait_for(lambda: control.paused, "the control to say pause")
        waiting = asyncio.ensure_future(control.until_running())
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await channel.set("nightly", "exit")
        assert await asyncio.wait_for(waiting, 5) is False
        assert control.exit_requested


async def test_the_control_plane_opens_the_channel(tmp_path: Path) -> None:
    config = CrawlhubConfig.model_validate({"data_dir": str(tmp_path)})
    plane = await ControlPlane.open(config)
    try:
        assert not plane.channel.distributed
        await plane.channel.set("nightly", "pause")
    finally:
        await plane.close()
    plane = await ControlPlane.open(config)
    try:
        assert await plane.channel.get("nightly") == "pause"
    finally:
        await plane.close()


async def test_embedded_a_change_by_another_process_on_the_database_arrives_within_a_second(
        tmp_path: Path) -> None:
    config = CrawlhubConfig.model_validate({"data_dir": str(tmp_path)})
    plane = await ControlPlane.open(config)
    cli = await ControlPlane.open(config)  # 'crawlhub jobs pause' beside 'crawlhub serve'
    try:
        assert plane.channel.reread <= 1.0
        watch = plane.channel.watch("nightly")
        assert await next_state(watch) == "run"
        await cli.channel.set("nightly", "pause")
        assert await next_state(watch, timeout=5) == "pause"
        await watch.aclose()  # type: ignore[attr-defined]
    finally:
        await cli.close()
        await plane.close()

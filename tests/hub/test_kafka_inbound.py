"""Kafka inbound on the Tansu broker: JSON objects in, offsets committed only after the
hub took them (at-least-once), junk skipped, several consumers in one group."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from crawlhub.core.errors import ConfigError
from crawlhub.hub.inbounds.base import InboundSource
from crawlhub.hub.inbounds.kafka import KafkaInbound
from tests.helpers import wait_for

Task = dict[str, Any]


async def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i, value in enumerate(values):
            await producer.send(topic, value, key=str(i).encode())
        await producer.flush()
    finally:
        await producer.stop()


async def committed(bootstrap: str, group: str, topic: str, partitions: int = 1) -> list[int | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        return [await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        await consumer.stop()


def inbound(bootstrap: str, topic: str, group: str, threads: int = 1, **init: Any) -> KafkaInbound:
    return KafkaInbound(
        "orders",
        {
            "consumer_settings": {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": "2000",
                "heartbeat.interval.ms": "500",
            },
            "topics": [topic],
            "retry_delay_ms": 50,
            **init,
        },
        threads=threads,
    )


async def run_until(
    source: KafkaInbound, deliver: Callable[[list[Task]], Awaitable[None]], done: asyncio.Event
) -> None:
    """Run ``source`` until ``done`` is set (by ``deliver``), then stop it cleanly."""
    stop = asyncio.Event()
    running = asyncio.create_task(source.run(deliver, stop))
    try:
        await asyncio.wait_for(done.wait(), 60)
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


async def test_json_objects_are_delivered_and_offsets_committed_after(
    kafka_bootstrap: str, unique_name: str
) -> None:
    await create_topic(kafka_bootstrap, unique_name)
    await produce(
        kafka_bootstrap,
        unique_name,
        [b'{"n": 1}', b"not json", b"[1, 2]", b'{"n": 2}', b'"text"', b'{"n": 3}'],
    )
    source = inbound(kafka_bootstrap, unique_name, unique_name)
    assert isinstance(source, InboundSource)
    got: list[Task] = []
    done = asyncio.Event()

    async def deliver(batch: list[Task]) -> None:
        got.extend(batch)
        if len(got) >= 3:
            done.set()

    await run_until(source, deliver, done)
    assert got == [{"n": 1}, {"n": 2}, {"n": 3}]  # junk skipped, order kept
    assert await committed(kafka_bootstrap, unique_name, unique_name) == [6]


async def test_messages_taken_but_not_acknowledged_are_redelivered(
    kafka_bootstrap: str, unique_name: str
) -> None:
    await create_topic(kafka_bootstrap, unique_name)
    await produce(kafka_bootstrap, unique_name, [json.dumps({"n": i}).encode() for i in range(4)])
    taken = asyncio.Event()

    async def hang(batch: list[Task]) -> None:
        taken.set()
        await asyncio.Event().wait()  # the hub dies before deliver returns

    crashing = inbound(kafka_bootstrap, unique_name, unique_name)
    crashed = asyncio.create_task(crashing.run(hang, asyncio.Event()))
    await asyncio.wait_for(taken.wait(), 60)
    crashed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await crashed
    assert await committed(kafka_bootstrap, unique_name, unique_name) == [None]

    got: list[Task] = []
    done = asyncio.Event()

    async def deliver(batch: list[Task]) -> None:
        got.extend(batch)
        if len(got) >= 4:
            done.set()

    await run_until(inbound(kafka_bootstrap, unique_name, unique_name), deliver, done)
    assert got == [{"n": i} for i in range(4)]


async def test_a_failing_deliver_gets_the_same_batch_again(
    kafka_bootstrap: str, unique_name: str
) -> None:
    await create_topic(kafka_bootstrap, unique_name)
    await produce(kafka_bootstrap, unique_name, [b'{"n": 1}', b'{"n": 2}'])
    calls: list[list[Task]] = []
    done = asyncio.Event()

    async def deliver(batch: list[Task]) -> None:
        calls.append(batch)
        if len(calls) == 1:
            raise RuntimeError("outbound queue unavailable")
        if sum(len(b) for b in calls[1:]) >= 2:
            done.set()

    await run_until(inbound(kafka_bootstrap, unique_name, unique_name), deliver, done)
    assert calls[0] == [{"n": 1}, {"n": 2}]
    assert [t for b in calls[1:] for t in b] == [{"n": 1}, {"n": 2}]
    assert await committed(kafka_bootstrap, unique_name, unique_name) == [2]


async def test_threads_are_consumers_of_one_group_that_together_take_every_message(
    kafka_bootstrap: str, unique_name: str
) -> None:
    await create_topic(kafka_bootstrap, unique_name, partitions=2)
    await produce(kafka_bootstrap, unique_name, [json.dumps({"n": i}).encode() for i in range(20)])
    source = inbound(kafka_bootstrap, unique_name, unique_name, threads=2)
    got: list[Task] = []
    done = asyncio.Event()
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()

    async def group_size() -> int:
        [response] = await admin.describe_consumer_groups([unique_name])
        return len(response.groups[0][-1])  # the members of the one group asked about

    async def both_consumers_joined() -> bool:
        return await group_size() >= 2

    async def deliver(batch: list[Task]) -> None:
        await wait_for(both_consumers_joined, "both consumers in the group", every=0.05)
        got.extend(batch)
        if len({t["n"] for t in got}) == 20:
            done.set()

    try:
        await run_until(source, deliver, done)
    finally:
        await admin.close()
    assert {t["n"] for t in got} == set(range(20))
    offsets = await committed(kafka_bootstrap, unique_name, unique_name, partitions=2)
    assert sum(o or 0 for o in offsets) == 20


def test_librdkafka_settings_become_consumer_arguments() -> None:
    source = inbound("a:9092,b:9092", "t", "g", **{"max_records": 10})
    kwargs = source.consumer_kwargs
    assert kwargs["bootstrap_servers"] == ["a:9092", "b:9092"]
    assert (kwargs["group_id"], kwargs["auto_offset_reset"]) == ("g", "earliest")
    assert kwargs["session_timeout_ms"] == 2000
    assert kwargs["enable_auto_commit"] is False  # commits follow deliver, always
    assert source.max_records == 10


@pytest.mark.parametrize(
    ("init", "key"),
    [
        ({"consumer_settings": {"bootstrap.servers": "a:1", "group.id": "g", "fetch.magic": 1},
          "topics": ["t"]}, "init.consumer_settings.fetch.magic"),
        ({"consumer_settings": {"bootstrap.servers": "a:1"}, "topics": ["t"]},
         "init.consumer_settings.group.id"),
        ({"consumer_settings": {"bootstrap.servers": "a:1", "group.id": "g"}, "topics": []},
         "init.topics"),
        ({"topics": ["t"]}, "init.consumer_settings"),
    ],
)
def test_bad_init_is_a_config_error_naming_the_key(init: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        KafkaInbound("orders", init)
    assert (info.value.entry, info.value.key) == ("inbound 'orders'", key)

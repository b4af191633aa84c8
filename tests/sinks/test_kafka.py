"""Kafka sink specifics on the Tansu broker: keyed messages consumers can dedupe by,
delivery before write_batch returns, producer settings."""

from __future__ import annotations

import json

import pytest

from crawlhub.core.errors import ConfigError, SinkError
from crawlhub.sinks import KafkaSink
from crawlhub.sinks.config import build_sink
from tests.sinks.conftest import read_kafka


def kafka_sink(bootstrap: str, topic: str, **spec: object) -> KafkaSink:
    sink = build_sink(
        {"type": "kafka", "bootstrap_servers": bootstrap, "topic": topic, "idempotence": False, **spec}
    )
    assert isinstance(sink, KafkaSink)
    return sink


async def test_message_key_is_the_record_key_so_consumers_can_dedupe(
    kafka_bootstrap: str, unique_name: str
) -> None:
    sink = kafka_sink(kafka_bootstrap, unique_name)
    await sink.open()
    try:
        await sink.write_batch([{"id": "a1", "v": 1}, {"id": 42, "v": 2}])
        await sink.write_batch([{"id": "a1", "v": 1}])  # redelivered: sent again
    finally:
        await sink.close()
    messages = await read_kafka(kafka_bootstrap, unique_name)
    assert sorted(key for key, _, _ in messages) == [b"42", b"a1", b"a1"]
    latest = {key: (value, headers) for key, value, headers in messages}
    assert latest[b"a1"][0] == {"id": "a1", "v": 1}
    first_a1 = next(h for k, _, h in messages if k == b"a1")
    assert latest[b"a1"][1]["content_hash"] == first_a1["content_hash"]  # same content, same hash


async def test_composite_key_becomes_a_json_array_message_key(
    kafka_bootstrap: str, unique_name: str
) -> None:
    sink = kafka_sink(kafka_bootstrap, unique_name, key=["shop", "id"])
    await sink.open()
    try:
        await sink.write_batch([{"shop": "s1", "id": 3}])
    finally:
        await sink.close()
    [(key, value, _)] = await read_kafka(kafka_bootstrap, unique_name)
    assert json.loads(key) == ["s1", 3] and value == {"shop": "s1", "id": 3}


async def test_a_batch_is_readable_as_soon_as_write_batch_returns(
    kafka_bootstrap: str, unique_name: str
) -> None:
    sink = kafka_sink(kafka_bootstrap, unique_name)
    await sink.open()
    try:
        await sink.write_batch([{"id": i} for i in range(20)])
        assert len(await read_kafka(kafka_bootstrap, unique_name)) == 20  # producer still open
    finally:
        await sink.close()


def test_linger_is_refused_because_it_would_hold_every_batch() -> None:
    sink = kafka_sink("127.0.0.1:1", "t", settings={"linger.ms": 500})
    with pytest.raises(ConfigError, match="linger.ms"):
        sink.producer_kwargs()


def test_producer_is_idempotent_with_acks_all_by_default() -> None:
    sink = build_sink(
        {
            "type": "kafka",
            "bootstrap_servers": "127.0.0.1:1",
            "topic": "t",
            "settings": {"compression.type": "gzip", "request.timeout.ms": "5000"},
        }
    )
    assert isinstance(sink, KafkaSink)
    kwargs = sink.producer_kwargs()
    assert kwargs["enable_idempotence"] is True and kwargs["acks"] == "all"
    assert kwargs["compression_type"] == "gzip" and kwargs["request_timeout_ms"] == 5000


def test_unknown_producer_setting_is_a_config_error_naming_it() -> None:
    sink = kafka_sink("127.0.0.1:1", "t", settings={"no.such.thing": 1})
    with pytest.raises(ConfigError, match="no.such.thing") as info:
        sink.producer_kwargs()
    assert info.value.key == "settings.no.such.thing"


async def test_broker_refusing_idempotent_producers_gives_an_error_naming_the_fix(
    kafka_bootstrap: str, unique_name: str
) -> None:
    # Tansu 0.6 answers aiokafka's InitProducerId v0 with an error
    sink = kafka_sink(kafka_bootstrap, unique_name, idempotence=True)
    with pytest.raises(SinkError, match="idempotence: false"):
        await sink.open()

"""Inbounds other than HTTP refuse messages nested past the one depth limit (MAX_DEPTH)
without wedging: Kafka skips them (the hub would refuse them on every redelivery)."""

from __future__ import annotations

from types import SimpleNamespace

from crawlhub.core.jsoncodec import MAX_DEPTH
from crawlhub.hub.inbounds.kafka import KafkaInbound


def kafka_message(value: bytes) -> SimpleNamespace:
    return SimpleNamespace(value=value, offset=7)


def deep(depth: int) -> bytes:
    return ('{"url":"http://a/","d":' + '{"a":' * (depth - 1) + "1" + "}" * depth).encode()


def test_kafka_inbound_skips_messages_nested_past_the_limit() -> None:
    inbound = KafkaInbound("k", {"consumer_settings": {"bootstrap.servers": "127.0.0.1:9",
                                                       "group.id": "g"}, "topics": ["t"]})
    partition = SimpleNamespace(topic="t", partition=0)

    assert inbound._decode(partition, kafka_message(deep(MAX_DEPTH))) is not None
    assert inbound._decode(partition, kafka_message(deep(MAX_DEPTH + 1))) is None
    # past the JSON parser's own depth: skipped as junk, not a crashed consumer
    assert inbound._decode(partition, kafka_message(deep(5000))) is None

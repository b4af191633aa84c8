"""Kafka sink (optional extra ``crawlhub[kafka]``): one message per record, keyed by it.

``write_batch`` returns only when the broker has acknowledged every message of the batch
(seed 000: deliver each batch before the next request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from crawlhub.backends.kafka import aiokafka_kwargs
from crawlhub.core.errors import ConfigError, SinkError
from crawlhub.core.extras import require
from crawlhub.sinks.base import BatchResult, SinkConfig
from crawlhub.sinks.records import prepare_batch


class KafkaSinkConfig(SinkConfig):
    """Produce each record to a topic, message key = record key, value = JSON."""

    type: Literal["kafka"] = "kafka"
    bootstrap_servers: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    #: Idempotent producer (acks=all, no duplicates from producer retries). Brokers without
    #: InitProducerId v0 support (e.g. Tansu 0.6) need ``idempotence: false``.
    idempotence: bool = True
    acks: Literal["all", 0, 1, -1] = "all"
    #: More producer settings, librdkafka style (``linger.ms``, ``compression.type``...).
    settings: dict[str, Any] = Field(default_factory=dict)

def load_aiokafka(who: str) -> Any:
    """The aiokafka module, or a MissingExtraError that says how to install it."""
    return require("aiokafka", "kafka", needed_by=who)


class KafkaSink:
    """Message key = the record key text, value = the record as JSON (metadata included),
    header ``content_hash``.

    Idempotency on Kafka is the consumer's: a redelivered batch is produced again, and
    consumers dedupe by message key (and ``content_hash``), or a compacted topic keeps the
    last message per key. The idempotent producer (``idempotence: true``, acks=all) keeps
    producer retries from adding duplicates. Everything that can be wrong with a record is
    checked before the first message is sent; a broker error mid-batch raises
    ``SinkError`` and the writer's retry sends the batch again (consumers dedupe).
    """

    def __init__(self, config: KafkaSinkConfig, *, name: str = "kafka") -> None:
        self.name = name
        self.config = config
        self.topic = config.topic
        self._producer: Any = None

    def producer_kwargs(self) -> dict[str, Any]:
        aiokafka = load_aiokafka(f"sink '{self.name}'")
        kwargs = aiokafka_kwargs(
            self.config.settings,
            aiokafka.AIOKafkaProducer,
            where=f"sink '{self.name}'",
            key="settings",
        )
        if kwargs.get("linger_ms"):
            raise ConfigError(
                "linger.ms would hold every batch that long: the pipeline writer already "
                "batches, and write_batch returns only when its batch is delivered; drop it",
                entry=f"sink '{self.name}'",
                key="settings.linger.ms",
            )
        kwargs["bootstrap_servers"] = self.config.bootstrap_servers
        kwargs["enable_idempotence"] = self.config.idempotence
        kwargs["acks"] = self.config.acks
        return kwargs

    async def open(self) -> None:
        aiokafka = load_aiokafka(f"sink '{self.name}'")
        producer = aiokafka.AIOKafkaProducer(**self.producer_kwargs())
        try:
            await producer.start()
        except Exception as exc:
            await producer.stop()
            hint = (
                "; the broker may not support idempotent producers: set 'idempotence: false'"
                if self.config.idempotence
                else ""
            )
            raise SinkError(
                f"sink '{self.name}': cannot start a Kafka producer for "
                f"{self.config.bootstrap_servers}: {exc!r}{hint}"
            ) from exc
        self._producer = producer

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        batch = prepare_batch(
            records, self.config.key, sink=self.name, hash_exclude=self.config.hash_exclude
        )
        if self._producer is None:
            raise SinkError(f"sink '{self.name}': write_batch before open(); open the sink first")
        messages = [
            (r.key_text.encode(), r.full_json().encode(), [("content_hash", r.content_hash.encode())])
            for r in batch.records
        ]
        pending: list[asyncio.Future[Any]] = []
        try:
            for key, value, headers in messages:
                pending.append(
                    await self._producer.send(self.topic, value=value, key=key, headers=headers)
                )
            await asyncio.gather(*pending)
        except Exception as exc:
            await asyncio.gather(*pending, return_exceptions=True)
            raise SinkError(
                f"sink '{self.name}': batch of {len(messages)} records not fully delivered to "
                f"topic {self.topic!r} at {self.config.bootstrap_servers}: {exc!r}; part of it "
                f"may have landed (consumers dedupe by key)"
            ) from exc
        return BatchResult(inserted=len(messages), skipped=batch.duplicates)

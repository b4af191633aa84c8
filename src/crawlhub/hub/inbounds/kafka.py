"""Kafka inbound (optional extra ``crawlhub[kafka]``): JSON task messages from topics.

Offsets are committed only after the hub's ``deliver`` returns (at-least-once); a
message that is not a JSON object is logged and skipped, never fatal.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from crawlhub.backends.kafka import aiokafka_kwargs
from crawlhub.core import jsoncodec, rejects
from crawlhub.core.errors import ConfigError
from crawlhub.hub.inbounds.base import Deliver

log = logging.getLogger(__name__)


class KafkaInbound:
    """Consumes ``topics`` with ``threads`` consumers in one consumer group.

    ``init`` is taskHUB's: ``consumer_settings`` (librdkafka names: ``bootstrap.servers``,
    ``group.id``, ``auto.offset.reset``, ...) and ``topics``; optional ``max_records``
    (batch size, default 100), ``poll_timeout_ms`` (default 500) and ``retry_delay_ms``
    (default 1000). Auto-commit is always off: each consumer commits a batch's offsets
    after ``deliver`` returned. When ``deliver`` raises, the consumer waits
    ``retry_delay_ms``, seeks back and delivers the batch again. A ``deliver`` blocked by
    backpressure for longer than ``max.poll.interval.ms`` (default 300000) costs the
    consumer its partitions; the batch is then redelivered to their new owner.
    """

    def __init__(self, name: str, init: Mapping[str, Any], *, threads: int = 1) -> None:
        self.name = name
        where = f"inbound '{name}'"
        if threads < 1:
            raise ConfigError(f"threads must be at least 1, got {threads}", entry=where, key="threads")
        settings = init.get("consumer_settings")
        if not isinstance(settings, Mapping):
            raise ConfigError(
                "consumer_settings must be a mapping with bootstrap.servers and group.id",
                entry=where,
                key="init.consumer_settings",
            )
        topics = init.get("topics")
        if isinstance(topics, str):
            topics = [topics]
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise ConfigError(
                f"topics must be a non-empty list of topic names, got {topics!r}",
                entry=where,
                key="init.topics",
            )
        self.topics: list[str] = list(topics)
        self.threads = threads
        self.max_records = int(init.get("max_records", 100))
        self.poll_timeout_ms = int(init.get("poll_timeout_ms", 500))
        self.retry_delay = int(init.get("retry_delay_ms", 1000)) / 1000
        aiokafka = _aiokafka(where)
        kwargs = aiokafka_kwargs(
            settings, aiokafka.AIOKafkaConsumer, where=where, key="init.consumer_settings"
        )
        for required in ("bootstrap_servers", "group_id"):
            if not kwargs.get(required):
                raise ConfigError(
                    f"consumer_settings needs {required.replace('_', '.')}",
                    entry=where,
                    key=f"init.consumer_settings.{required.replace('_', '.')}",
                )
        kwargs["enable_auto_commit"] = False
        self.consumer_kwargs = kwargs

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        """Run ``threads`` consumers until ``stop`` is set."""
        await asyncio.gather(*(self._consume(i, deliver, stop) for i in range(self.threads)))

    async def _consume(self, number: int, deliver: Deliver, stop: asyncio.Event) -> None:
        aiokafka = _aiokafka(f"inbound '{self.name}'")
        consumer = aiokafka.AIOKafkaConsumer(*self.topics, **self.consumer_kwargs)
        await consumer.start()
        log.info(
            "inbound %s: consumer %d joined group %s on %s",
            self.name,
            number,
            self.consumer_kwargs["group_id"],
            self.topics,
        )
        try:
            while not stop.is_set():
                polled = await consumer.getmany(
                    timeout_ms=self.poll_timeout_ms, max_records=self.max_records
                )
                if not polled:
                    continue
                batch = [
                    task
                    for partition, messages in polled.items()
                    for message in messages
                    if (task := self._decode(partition, message)) is not None
                ]
                try:
                    if batch:
                        await deliver(batch)
                except Exception:
                    log.exception(
                        "inbound %s: deliver failed for %d messages; they will be redelivered",
                        self.name,
                        len(batch),
                    )
                    for partition, messages in polled.items():
                        consumer.seek(partition, messages[0].offset)
                    await _sleep_or_stop(stop, self.retry_delay)
                    continue
                offsets = {tp: messages[-1].offset + 1 for tp, messages in polled.items()}
                try:
                    await consumer.commit(offsets)
                except aiokafka.errors.KafkaError as exc:
                    # A rebalance moved the partition: its new owner redelivers.
                    log.warning("inbound %s: offset commit failed (%r)", self.name, exc)
        finally:
            await consumer.stop()

    def _decode(self, partition: Any, message: Any) -> dict[str, Any] | None:
        """The message as a task, or None for junk: counted
        (``crawlhub_stream_entries_rejected_total{stream="inbound:kafka"}``), logged once
        with its offset and skipped - the topic keeps it for inspection."""
        where = f"{partition.topic}[{partition.partition}]@{message.offset}"
        try:
            task = json.loads(message.value) if message.value is not None else None
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return self._junk(where, f"not JSON: {exc}")
        if not isinstance(task, dict):
            return self._junk(where, f"a {type(task).__name__}, not a JSON object")
        if jsoncodec.too_deep(task):
            # The hub would refuse it on every redelivery: skip it like junk.
            return self._junk(where, str(jsoncodec.TooDeepError("it")))
        return task

    def _junk(self, where: str, detail: str) -> dict[str, Any] | None:
        rejects.rejected("inbound:kafka", where, rejects.MALFORMED,
                         f"inbound {self.name}: {detail}; skipped")
        return None


def _aiokafka(where: str) -> Any:
    from crawlhub.core.extras import require

    require("aiokafka.errors", "kafka", needed_by=f"the kafka inbound {where}")
    return require("aiokafka", "kafka", needed_by=f"the kafka inbound {where}")


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass

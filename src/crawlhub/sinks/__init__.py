"""Sinks: where the pipeline's single writer puts records (JSON lines, SQLite, PostgreSQL,
Redis stream, Kafka), one idempotent batch at a time.

Build one from config with :func:`crawlhub.sinks.config.build_sink`.
"""

from typing import TYPE_CHECKING

from crawlhub.core.lazy import lazy_face

if TYPE_CHECKING:  # the names below, imported on first use (start-up: crawlhub.core.lazy)
    from crawlhub.sinks.base import BatchResult, Sink, SnapshotSink, TableResult
    from crawlhub.sinks.jsonl import JsonlSink
    from crawlhub.sinks.kafka import KafkaSink
    from crawlhub.sinks.postgres import PostgresSink, Scd2Merger
    from crawlhub.sinks.records import METADATA_FIELDS, content_hash, prepare_batch, stable_json
    from crawlhub.sinks.redis_stream import RedisStreamSink
    from crawlhub.sinks.sqlite import SqliteSink

__all__ = [
    "METADATA_FIELDS",
    "BatchResult",
    "JsonlSink",
    "KafkaSink",
    "PostgresSink",
    "RedisStreamSink",
    "Scd2Merger",
    "Sink",
    "SnapshotSink",
    "SqliteSink",
    "TableResult",
    "content_hash",
    "prepare_batch",
    "stable_json",
]

__getattr__, __dir__ = lazy_face(__name__, {
    "BatchResult": "crawlhub.sinks.base",
    "Sink": "crawlhub.sinks.base",
    "SnapshotSink": "crawlhub.sinks.base",
    "TableResult": "crawlhub.sinks.base",
    "JsonlSink": "crawlhub.sinks.jsonl",
    "KafkaSink": "crawlhub.sinks.kafka",
    "PostgresSink": "crawlhub.sinks.postgres",
    "Scd2Merger": "crawlhub.sinks.postgres",
    "METADATA_FIELDS": "crawlhub.sinks.records",
    "content_hash": "crawlhub.sinks.records",
    "prepare_batch": "crawlhub.sinks.records",
    "stable_json": "crawlhub.sinks.records",
    "RedisStreamSink": "crawlhub.sinks.redis_stream",
    "SqliteSink": "crawlhub.sinks.sqlite",
})

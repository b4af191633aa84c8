"""Sinks: where the pipeline's single writer puts records (JSON lines, SQLite, PostgreSQL,
Redis stream, Kafka), one idempotent batch at a time.

Build one from config with :func:`crawlhub.sinks.config.build_sink`.
"""

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

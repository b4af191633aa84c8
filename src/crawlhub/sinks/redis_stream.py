"""Redis stream sink: XADD each new or changed record, once.

One Lua script per batch checks a hash of written key -> content hash and adds only what
is new or changed, so a redelivered batch adds no entry; everything else is checked first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from crawlhub.backends.redis import lua
from crawlhub.core.errors import SinkError
from crawlhub.core.keys import DEFAULT_PREFIX, sink_stream_index
from crawlhub.core.redact import redact_url
from crawlhub.sinks.base import BatchResult, SinkConfig
from crawlhub.sinks.records import prepare_batch


class RedisStreamSinkConfig(SinkConfig):
    """XADD to a Redis stream; a hash of written keys makes redelivery a no-op."""

    type: Literal["redis_stream"] = "redis_stream"
    url: str
    stream: str = Field(min_length=1)
    #: Trim the stream to about this many entries (``MAXLEN ~``); None keeps everything.
    maxlen: int | None = Field(default=None, ge=1)
    approximate: bool = True
    prefix: str = DEFAULT_PREFIX

_WRITE = lua(__package__, "redis_stream.lua")


class RedisStreamSink:
    """Entries carry fields ``key``, ``content_hash`` and ``data`` (the record as JSON,
    metadata included). The index hash is never trimmed with the stream, so a record
    redelivered long after ``maxlen`` dropped its entry is still recognised."""

    def __init__(self, config: RedisStreamSinkConfig, *, name: str = "redis_stream") -> None:
        self.name = name
        self.config = config
        self.stream = config.stream
        self.index = sink_stream_index(config.prefix, config.stream)
        self._redis: Any = None
        self._script: Any = None

    async def open(self) -> None:
        from crawlhub.backends.redis import redis_client

        self._redis = redis_client(self.config.url, name=f"sink {self.name!r}")
        self._script = self._redis.register_script(_WRITE)

    async def close(self) -> None:
        redis, self._redis = self._redis, None
        if redis is not None:
            await redis.aclose()

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        batch = prepare_batch(
            records, self.config.key, sink=self.name, hash_exclude=self.config.hash_exclude
        )
        if self._redis is None:
            raise SinkError(f"sink '{self.name}': write_batch before open(); open the sink first")
        args: list[Any] = [self.config.maxlen or 0, 1 if self.config.approximate else 0]
        for record in batch.records:
            args.extend((record.key_text, record.content_hash, record.full_json()))
        try:
            inserted, updated, skipped = await self._script(keys=[self.stream, self.index], args=args)
        except Exception as exc:
            raise SinkError(
                f"sink '{self.name}': batch of {len(batch.records)} records not added to "
                f"stream {self.stream!r} at {redact_url(self.config.url)}: {exc}"
            ) from exc
        return BatchResult(
            inserted=int(inserted), updated=int(updated), skipped=int(skipped) + batch.duplicates
        )


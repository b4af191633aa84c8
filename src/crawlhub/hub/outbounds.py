"""Outbound transports: where a routed task's params are pushed.

``queue`` pushes onto a crawlhub reliable queue on the configured backend; ``redis_list``
pushes onto a plain Redis list (or a sorted set by priority), as taskHUB did, so existing
spiders that BRPOP / ZPOPMIN keep working. Others load by import path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from crawlhub.core import jsoncodec
from crawlhub.core.errors import ConfigError
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.core.loading import import_object
from crawlhub.queues.base import QueueBackend, ReliableQueue


@runtime_checkable
class OutboundTransport(Protocol):
    """Built by :func:`build_transport`; ``send`` must be durable when it returns."""

    async def send(self, items: Sequence[tuple[dict[str, Any], int]]) -> None:
        """Push ``(params, priority)`` items."""
        ...

    async def lag(self) -> int:
        """Tasks pushed and not yet taken or finished: what ``max_lag`` compares with."""
        ...

    async def close(self) -> None: ...


class QueueOutbound:
    """Pushes onto a crawlhub reliable queue (leases, acks, priorities).

    ``backend`` lets the hub push a whole batch for every queue outbound on one backend
    in a single call (:meth:`QueueBackend.push_multi`).
    """

    def __init__(self, queue: ReliableQueue, backend: QueueBackend | None = None) -> None:
        self.queue = queue
        self.backend = backend

    async def send(self, items: Sequence[tuple[dict[str, Any], int]]) -> None:
        if len(items) == 1:
            await self.queue.push(items[0][0], items[0][1])
        else:
            await self.queue.push_many(list(items))

    async def lag(self) -> int:
        return await self.queue.length()

    async def close(self) -> None:
        return None


class RedisListOutbound:
    """taskHUB-compatible: JSON params on a Redis list (LPUSH; spiders BRPOP), or on a
    sorted set when ``sorted: true`` (score = -priority, so ZPOPMIN takes the highest).

    On a list, tasks above the outbound's normal priority (real-time tasks) are pushed
    on the consuming end (RPUSH) so the next BRPOP takes them first.
    """

    def __init__(self, url: str, key: str, *, sorted: bool = False, normal_priority: int = 0
                 ) -> None:
        from crawlhub.backends.redis import redis_client

        self.url = url
        self.key = key
        self.sorted = sorted
        self.normal_priority = normal_priority
        self._redis = redis_client(url, name=f"outbound list {key!r}")

    async def send(self, items: Sequence[tuple[dict[str, Any], int]]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            if self.sorted:
                pipe.zadd(self.key, {_dumps(p): -prio for p, prio in items})
            else:
                normal = [_dumps(p) for p, prio in items if prio <= self.normal_priority]
                urgent = [_dumps(p) for p, prio in items if prio > self.normal_priority]
                if normal:
                    pipe.lpush(self.key, *normal)
                if urgent:
                    pipe.rpush(self.key, *urgent)
            await pipe.execute()

    async def lag(self) -> int:
        if self.sorted:
            return int(await self._redis.zcard(self.key))
        return int(await self._redis.llen(self.key))

    async def close(self) -> None:
        await self._redis.aclose()


def _dumps(params: dict[str, Any]) -> str:
    return jsoncodec.dumps(params)


def max_attempts_of(class_name: str, init: Mapping[str, Any], *, file: str | None = None,
                    entry: str | None = None) -> int | None:
    """``init.max_attempts`` of a queue outbound: deliveries without an ack before a task
    goes to the dead letter (absent: the queue's stored limit, else 10). A ``redis_list``
    has no leases, so the key is an error there; user classes read their own init."""
    value = init.get("max_attempts")
    if value is None or class_name not in QUEUE_NAMES | REDIS_LIST_NAMES:
        return None
    if class_name in REDIS_LIST_NAMES:
        raise ConfigError(
            f"init.max_attempts applies to 'queue' outbounds only (deliveries without an"
            f" ack before the dead letter); a {class_name} has no leases: remove it",
            file=file,
            entry=entry,
            key="init.max_attempts",
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"max_attempts must be a whole number >= 1 (deliveries without an ack before the"
            f" dead letter, e.g. 10), got {value!r}",
            file=file,
            entry=entry,
            key="init.max_attempts",
        )
    return value


#: Class names accepted for the built-in transports (taskHUB's names included).
QUEUE_NAMES = frozenset({"queue", "crawlhub.queue", "QueueOutbound"})
REDIS_LIST_NAMES = frozenset(
    {"redis_list", "redis_zset", "redis_queue.RedisListOutbound", "RedisListOutbound"}
)


def build_transport(
    name: str,
    class_name: str,
    init: dict[str, Any],
    *,
    queues: QueueBackend,
    priority: int = 0,
    file: str | None = None,
    entry: str | None = None,
) -> OutboundTransport:
    """Build the transport of one outbound entry; errors name the entry and key."""
    if class_name in QUEUE_NAMES:
        key = str(init.get("key") or name)
        max_attempts = max_attempts_of(class_name, init, file=file, entry=entry)
        backend = queues
        if init.get("url"):
            from crawlhub.queues import open_backend

            backend = open_backend(str(init["url"]), prefix=str(init.get("prefix", DEFAULT_PREFIX)))
        return QueueOutbound(backend.queue(key, max_attempts=max_attempts), backend)
    if class_name in REDIS_LIST_NAMES:
        max_attempts_of(class_name, init, file=file, entry=entry)
        missing = [k for k in ("url", "key") if not init.get(k)]
        if missing:
            raise ConfigError(
                f"redis_list outbound needs init.{missing[0]} (e.g. url: 'redis://127.0.0.1:6379/0',"
                " key: 'my_spider')",
                file=file,
                entry=entry,
                key=f"init.{missing[0]}",
            )
        return RedisListOutbound(
            str(init["url"]),
            str(init["key"]),
            sorted=bool(init.get("sorted", class_name == "redis_zset")),
            normal_priority=priority,
        )
    cls = import_object(class_name, file=file, entry=entry, key="class")
    try:
        return cls(name=name, init=init, queues=queues)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise ConfigError(
            f"outbound class {class_name!r} could not be built: {exc}; it must accept"
            " (name=, init=, queues=)",
            file=file,
            entry=entry,
            key="class",
        ) from exc

"""Inbounds: where messages come in. A built inbound (:class:`Inbound`: its selectors and
converters) and, for every class but ``http``, the source that consumes messages
(:func:`build_source`; the protocol in :mod:`.base`, one file per kind)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crawlhub.errors import ConfigError, ConvertError
from crawlhub.hub.converters import Converter
from crawlhub.hub.inbounds.base import InboundSource
from crawlhub.loading import import_object
from crawlhub.selectors import SelectorSet

if TYPE_CHECKING:
    from crawlhub.hub.plan import InboundPlan

HTTP_NAMES = frozenset({"http", "http.HttpInbound", "HttpInbound"})
REDIS_NAMES = frozenset({"redis", "redis_list", "redis_stream", "redis.RedisInbound",
                         "RedisInbound"})
KAFKA_NAMES = frozenset({"kafka", "kafka.KafkaInbound", "KafkaInbound"})


@dataclass(slots=True)
class Inbound:
    """One inbound entry, built: selectors, converters and (unless http) its source."""

    name: str
    class_name: str
    selectors: SelectorSet
    converters: list[Converter]
    derive: bool = False
    frontier: str | None = None
    threads: int = 1
    disabled: bool = False
    init: dict[str, Any] = field(default_factory=dict)

    @property
    def is_http(self) -> bool:
        return self.class_name in HTTP_NAMES

    def convert(self, message: Mapping[str, Any]) -> dict[str, Any] | None:
        """Run the converters; a converter that raises is a :class:`ConvertError`."""
        data: dict[str, Any] | None = dict(message)
        for index, converter in enumerate(self.converters):
            if data is None:
                return None
            try:
                data = converter(data)
            except Exception as exc:
                raise ConvertError(
                    f"inbound {self.name!r}: convert[{index}]"
                    f" ({type(converter).__name__}) failed on a message: {exc}") from exc
        return data


def redis_init(class_name: str, init: Mapping[str, Any]) -> dict[str, Any]:
    """The ``init`` of a Redis inbound, with the ``type`` its class name implies."""
    out = dict(init)
    kind = {"redis_list": "list", "redis_stream": "stream"}.get(class_name)
    if kind:
        out.setdefault("type", kind)
    return out


def build_source(inbound: Inbound | InboundPlan, *, file: str | None,
                 entry: str | None) -> InboundSource:
    """The source of a non-http inbound; errors name the entry and key."""
    name = inbound.class_name
    if name in REDIS_NAMES:
        from crawlhub.hub.inbounds.redis import RedisInbound

        try:
            return RedisInbound(inbound.name, redis_init(name, inbound.init),
                                threads=inbound.threads)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, entry=entry, key="init") from exc
    if name in KAFKA_NAMES:
        try:
            from crawlhub.hub.inbounds.kafka import KafkaInbound
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise ConfigError("the kafka inbound needs the kafka extra:"
                              " pip install 'crawlhub[kafka]'", file=file, entry=entry,
                              key="class") from exc
        try:
            return KafkaInbound(inbound.name, dict(inbound.init), threads=inbound.threads)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, entry=entry, key="init") from exc
    cls = import_object(name, file=file, entry=entry, key="class")
    return cls(inbound.name, dict(inbound.init), threads=inbound.threads)  # type: ignore[no-any-return]

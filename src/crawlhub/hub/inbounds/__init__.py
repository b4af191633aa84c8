"""Inbounds: where messages come in. An inbound entry as :mod:`crawlhub.hub.plan` compiles
it (:class:`InboundPlan`), built (:class:`Inbound`: that entry and its converters) and, for
every class but ``http``, the source that consumes messages (:func:`build_source`; the
protocol in :mod:`.base`, one file per kind)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crawlhub.core.errors import ConfigError, ConvertError
from crawlhub.core.loading import import_object
from crawlhub.core.selectors import SelectorSet
from crawlhub.hub.converters import Converter
from crawlhub.hub.inbounds.base import InboundSource

HTTP_NAMES = frozenset({"http", "http.HttpInbound", "HttpInbound"})
REDIS_NAMES = frozenset({"redis", "redis_list", "redis_stream", "redis.RedisInbound",
                         "RedisInbound"})
KAFKA_NAMES = frozenset({"kafka", "kafka.KafkaInbound", "KafkaInbound"})


@dataclass(frozen=True, slots=True)
class ConverterPlan:
    """One ``convert:`` entry of an inbound: its class and arguments; ``key`` locates it
    (``convert[0]``)."""

    class_name: str
    init: dict[str, Any]
    key: str


@dataclass(slots=True)
class InboundPlan:
    """One inbound entry, compiled: selectors, converters to build and its source class."""

    name: str
    class_name: str
    selectors: SelectorSet
    converters: list[ConverterPlan]
    derive: bool = False
    frontier: str | None = None
    threads: int = 1
    disabled: bool = False
    init: dict[str, Any] = field(default_factory=dict)
    #: where errors point: the config file and the entry (``inbound[0] 'http'``)
    file: str | None = None
    entry: str | None = None

    @property
    def is_http(self) -> bool:
        return self.class_name in HTTP_NAMES


@dataclass(slots=True)
class Inbound:
    """One inbound entry, built: its compiled entry (:class:`InboundPlan`: name, class,
    selectors, derive, frontier, ...) and its converters, constructed."""

    plan: InboundPlan
    converters: list[Converter]

    @property
    def name(self) -> str:
        return self.plan.name

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


def redis_source(name: str, class_name: str, init: Mapping[str, Any], threads: int, *,
                 file: str | None, entry: str | None) -> InboundSource:
    """A Redis inbound (its constructor only reads ``init``: no I/O), with the ``type``
    its class name implies; a bad ``init`` is a ConfigError naming the entry."""
    from crawlhub.hub.inbounds.redis import RedisInbound

    init = dict(init)
    kind = {"redis_list": "list", "redis_stream": "stream"}.get(class_name)
    if kind:
        init.setdefault("type", kind)
    try:
        return RedisInbound(name, init, threads=threads)
    except ValueError as exc:
        raise ConfigError(str(exc), file=file, entry=entry, key="init") from exc


def kafka_inbound_class(*, file: str | None, entry: str | None) -> type[InboundSource]:
    """The Kafka inbound's class; a ConfigError naming the entry without the extra."""
    try:
        from crawlhub.hub.inbounds.kafka import KafkaInbound
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise ConfigError("the kafka inbound needs the kafka extra:"
                          " pip install 'crawlhub[kafka]'", file=file, entry=entry,
                          key="class") from exc
    return KafkaInbound


def build_source(plan: InboundPlan) -> InboundSource:
    """The source of a non-http inbound; errors name the entry and key."""
    name, where = plan.class_name, {"file": plan.file, "entry": plan.entry}
    if name in REDIS_NAMES:
        return redis_source(plan.name, name, plan.init, plan.threads, **where)
    if name in KAFKA_NAMES:
        try:
            return kafka_inbound_class(**where)(plan.name, dict(plan.init),
                                                threads=plan.threads)  # type: ignore[call-arg]
        except ValueError as exc:
            raise ConfigError(str(exc), key="init", **where) from exc
    cls = import_object(name, key="class", **where)
    return cls(plan.name, dict(plan.init), threads=plan.threads)  # type: ignore[no-any-return]

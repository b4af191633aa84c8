"""What ``crawlhub check-config`` checks beyond the schema, without building the hub:
user classes are imported and inspected, never instantiated.

A config names trusted code (as Scrapy settings do): importing a module runs its top
level. But constructors, which may open connections or write files, run only in ``serve``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crawlhub.errors import ConfigError, ConfigErrors
from crawlhub.hub.converters import _TASKHUB_MODULES, BUILTIN_CONVERTERS
from crawlhub.hub.hub import HTTP_NAMES, KAFKA_NAMES, REDIS_NAMES
from crawlhub.hub.outbounds import QUEUE_NAMES, REDIS_LIST_NAMES, max_attempts_of
from crawlhub.hub.routing import OutboundRule
from crawlhub.loading import check_call, import_object

#: Methods a user class must define for each role (their instances are what the hub calls).
OUTBOUND_METHODS = ("send", "lag", "close")
INBOUND_METHODS = ("run",)


def check_hub(config: Any) -> None:
    """Raise ConfigError (or ConfigErrors, all at once) for what ``Hub.from_config`` would
    refuse: unknown classes and converters, wrong kinds of class, constructors that cannot
    take the config's arguments, missing ``init`` keys, undefined frontiers."""
    errors: list[ConfigError] = []
    frontiers = set(config.frontier or {})
    default_timeout = getattr(config.routing, "result_timeout", None)
    for ob in config.outbound:
        where = {"file": ob.source_file, "entry": ob.label}
        _collect(errors, OutboundRule.from_config, ob, default_result_timeout=default_timeout)
        if ob.frontier and ob.frontier not in frontiers:
            errors.append(ConfigError(f"frontier {ob.frontier!r} is not defined under"
                                      " 'frontier:'", key="frontier", **where))
        if not ob.disable:
            _collect(errors, _check_outbound_class, ob.class_, dict(ob.init), where)
    for ib in config.inbound:
        where = {"file": ib.source_file, "entry": ib.label}
        for index, conv in enumerate(ib.convert):
            _collect(errors, _check_converter, conv.class_, dict(conv.init), where,
                     f"convert[{index}]")
        if ib.frontier and ib.frontier not in frontiers:
            errors.append(ConfigError(f"frontier {ib.frontier!r} is not defined under"
                                      " 'frontier:'", key="frontier", **where))
        if not ib.disable and ib.class_ not in HTTP_NAMES:
            _collect(errors, _check_inbound_class, ib.name, ib.class_, dict(ib.init),
                     int(ib.threads), where)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)


def _collect(errors: list[ConfigError], check: Any, *args: Any, **kwargs: Any) -> None:
    try:
        check(*args, **kwargs)
    except ConfigError as exc:
        errors.append(exc)


def _check_outbound_class(class_name: str, init: Mapping[str, Any],
                          where: dict[str, Any]) -> None:
    max_attempts_of(class_name, init, **where)
    if class_name in QUEUE_NAMES:
        if init.get("url"):
            _check_url(str(init["url"]), "queue outbound", where)
        return
    if class_name in REDIS_LIST_NAMES:
        for key in ("url", "key"):
            if not init.get(key):
                raise ConfigError(
                    f"redis_list outbound needs init.{key} (e.g. url:"
                    " 'redis://127.0.0.1:6379/0', key: 'my_spider')",
                    key=f"init.{key}", **where)
        _check_url(str(init["url"]), "redis_list outbound", where, kinds=("redis",))
        return
    target = import_object(class_name, key="class", **where)
    check_call(target, what=f"outbound class {class_name!r}", kwargs=("name", "init", "queues"),
               methods=OUTBOUND_METHODS, key="class", **where)


def _check_converter(class_name: str, init: Mapping[str, Any], where: dict[str, Any],
                     key: str) -> None:
    module, _, last = class_name.rpartition(".")
    if last in BUILTIN_CONVERTERS and module in _TASKHUB_MODULES:
        target: Any = BUILTIN_CONVERTERS[last]
    else:
        target = import_object(class_name, key=f"{key}.class", **where)
    check_call(target, what=f"converter {class_name!r}", kwargs=[str(k) for k in init],
               methods=("__call__",), key=f"{key}.init" if init else f"{key}.class", **where)


def _check_inbound_class(name: str, class_name: str, init: dict[str, Any], threads: int,
                         where: dict[str, Any]) -> None:
    if class_name in REDIS_NAMES:
        from crawlhub.hub.inbounds.redis import RedisInbound

        kind = {"redis_list": "list", "redis_stream": "stream"}.get(class_name)
        if kind:
            init.setdefault("type", kind)
        try:  # crawlhub's own class: its constructor only reads init, no I/O
            RedisInbound(name, init, threads=threads)
        except ValueError as exc:
            raise ConfigError(str(exc), key="init", **where) from exc
        return
    if class_name in KAFKA_NAMES:
        try:
            import crawlhub.hub.inbounds.kafka  # noqa: F401
        except ImportError as exc:
            raise ConfigError("the kafka inbound needs the kafka extra:"
                              " pip install 'crawlhub[kafka]'", key="class", **where) from exc
        return
    target = import_object(class_name, key="class", **where)
    check_call(target, what=f"inbound class {class_name!r}", args=("name", "init"),
               kwargs=("threads",), methods=INBOUND_METHODS, key="class", **where)


def _check_url(url: str, what: str, where: dict[str, Any],
               kinds: tuple[str, ...] | None = None) -> None:
    from crawlhub.storage.urls import parse_backend_url

    try:
        parse_backend_url(url, kinds=kinds, what=what, key="init.url")  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(exc.reason, key="init.url", **where) from None

"""Compiling a config into a :class:`HubPlan`: every outbound rule, selector, converter and
class checked, nothing built. ``check-config`` stops here; ``Hub.from_config`` builds on it.

A pure step: no queue, state, file or connection is opened. User classes (outbounds,
inbound sources, converters) are imported and inspected (kind, methods, constructor
signature against the ``init`` keys), never instantiated: a config names trusted code (as
Scrapy settings do) and importing a module runs its top level, but constructors, which may
open connections or write files, run only when the hub is built (``serve``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from crawlhub.core.errors import ConfigError, ConfigErrors
from crawlhub.core.loading import check_call, import_object
from crawlhub.core.selectors import compile_selectors
from crawlhub.hub.converters import _TASKHUB_MODULES, BUILTIN_CONVERTERS
from crawlhub.hub.inbounds import (
    HTTP_NAMES,
    KAFKA_NAMES,
    REDIS_NAMES,
    ConverterPlan,
    InboundPlan,
    kafka_inbound_class,
    redis_source,
)
from crawlhub.hub.outbounds import QUEUE_NAMES, REDIS_LIST_NAMES, max_attempts_of
from crawlhub.hub.routing import OutboundRule, Router

if TYPE_CHECKING:
    from crawlhub.config.schema import CrawlhubConfig

#: Methods a user class must define for each role (their instances are what the hub calls).
OUTBOUND_METHODS = ("send", "lag", "close")
INBOUND_METHODS = ("run",)


@dataclass(slots=True)
class OutboundPlan:
    """One outbound entry, compiled: its routing rule and the transport to build."""

    rule: OutboundRule
    class_name: str
    init: dict[str, Any]
    file: str | None = None
    entry: str | None = None

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def frontier(self) -> str | None:
        return self.rule.frontier


@dataclass(slots=True)
class HubPlan:
    """What a hub is built from: the router (every outbound rule, in order), the inbounds
    and outbounds with what their sources and transports need, and the hub settings."""

    router: Router
    outbounds: list[OutboundPlan]
    inbounds: list[InboundPlan]
    submitter: str = "crawlhub"
    failure_path: str = "failures.jsonl"
    failure_compress: bool = False


def compile_config(config: CrawlhubConfig) -> HubPlan:
    """Compile a validated :class:`CrawlhubConfig`; raise ConfigError (one problem) or
    ConfigErrors (all of them at once) for what a hub cannot be built from: unknown
    classes and converters, wrong kinds of class, constructors that cannot take the
    config's arguments, missing ``init`` keys, undefined frontiers."""
    errors: list[ConfigError] = []
    frontiers = set(config.frontier or {})
    default_timeout = getattr(config.routing, "result_timeout", None)
    outbounds: list[OutboundPlan] = []
    for ob in config.outbound:
        where = {"file": ob.source_file, "entry": ob.label}
        rule = _collect(errors, OutboundRule.from_config, ob,
                        default_result_timeout=default_timeout)
        _collect(errors, check_frontier, ob.frontier, frontiers, **where)
        if not ob.disable:
            _collect(errors, _check_outbound_class, ob.class_, dict(ob.init), where)
        if rule is not None:
            outbounds.append(OutboundPlan(rule, ob.class_, dict(ob.init), **where))
    inbounds: list[InboundPlan] = []
    for ib in config.inbound:
        where = {"file": ib.source_file, "entry": ib.label}
        converters = []
        for index, conv in enumerate(ib.convert):
            converter = ConverterPlan(conv.class_, dict(conv.init), f"convert[{index}]")
            _collect(errors, _check_converter, converter, where)
            converters.append(converter)
        _collect(errors, check_frontier, ib.frontier, frontiers, **where)
        if not ib.disable and ib.class_ not in HTTP_NAMES:
            _collect(errors, _check_inbound_class, ib.name, ib.class_, dict(ib.init),
                     int(ib.threads), where)
        selectors = _collect(errors, compile_selectors, list(ib.selector))
        if selectors is not None:
            inbounds.append(InboundPlan(
                name=ib.name, class_name=ib.class_, selectors=selectors,
                converters=converters, derive=bool(ib.derive), frontier=ib.frontier,
                threads=int(ib.threads), disabled=bool(ib.disable), init=dict(ib.init),
                **where))
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)
    router = Router([o.rule for o in outbounds], limits=config.routing.limits,
                    terminal_codes=config.routing.terminal_codes)
    return HubPlan(router=router, outbounds=outbounds, inbounds=inbounds,
                   submitter=config.submitter, failure_path=config.failure.path,
                   failure_compress=config.failure.compress)


def check_frontier(name: str | None, known: Collection[str], *, file: str | None,
                   entry: str | None) -> None:
    """A ConfigError naming the entry when it names a frontier not among ``known``."""
    if name and name not in known:
        raise ConfigError(f"frontier {name!r} is not defined under 'frontier:'",
                          file=file, entry=entry, key="frontier")


T = TypeVar("T")


def _collect(errors: list[ConfigError], check: Callable[..., T], *args: Any,
                **kwargs: Any) -> T | None:
    try:
        return check(*args, **kwargs)
    except ConfigError as exc:
        errors.append(exc)
        return None


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


def _check_converter(converter: ConverterPlan, where: dict[str, Any]) -> None:
    class_name, init, key = converter.class_name, converter.init, converter.key
    module, _, last = class_name.rpartition(".")
    if last in BUILTIN_CONVERTERS and module in _TASKHUB_MODULES:
        target: Any = BUILTIN_CONVERTERS[last]
    else:
        target = import_object(class_name, key=f"{key}.class", **where)
    check_call(target, what=f"converter {class_name!r}", kwargs=[str(k) for k in init],
               methods=("__call__",), key=f"{key}.init" if init else f"{key}.class", **where)


def _check_inbound_class(name: str, class_name: str, init: dict[str, Any], threads: int,
                         where: dict[str, Any]) -> None:
    if class_name in REDIS_NAMES:  # crawlhub's own class: its constructor does no I/O
        redis_source(name, class_name, init, threads, **where)
        return
    if class_name in KAFKA_NAMES:
        kafka_inbound_class(**where)
        return
    target = import_object(class_name, key="class", **where)
    check_call(target, what=f"inbound class {class_name!r}", args=("name", "init"),
               kwargs=("threads",), methods=INBOUND_METHODS, key="class", **where)


def _check_url(url: str, what: str, where: dict[str, Any],
               kinds: tuple[str, ...] | None = None) -> None:
    from crawlhub.backends.backend import Backend

    try:
        Backend.parse(url, kinds=kinds, what=what, key="init.url")  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(exc.reason, key="init.url", **where) from None

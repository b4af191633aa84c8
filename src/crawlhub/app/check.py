"""Everything ``crawlhub check-config`` checks beyond the schema, without building anything:
the hub's compile (:func:`crawlhub.hub.plan.compile_config`: rules, selectors, classes
and converters), frontier key functions and segment resolvers, collection jobs' sinks,
and the client package of every backend the config names (its extra installed).

User code is imported and inspected, never called (see :mod:`crawlhub.core.loading`); no
queue, state or connection is opened.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from crawlhub.core.errors import ConfigError, ConfigErrors
from crawlhub.core.loading import check_call, import_object

if TYPE_CHECKING:
    from crawlhub.config.schema import CrawlhubConfig


def check_config(config: CrawlhubConfig) -> None:
    """Raise ConfigError (one problem) or ConfigErrors (all of them) for ``config``."""
    errors: list[ConfigError] = []
    for check in (check_hub, check_frontiers, check_job_sinks):
        try:
            check(config)
        except ConfigErrors as exc:
            errors.extend(exc.errors)
        except ConfigError as exc:
            errors.append(exc)
    _raise(errors)
    check_extras(config)


def check_hub(config: CrawlhubConfig) -> None:
    """What ``Hub.from_config`` would refuse: the hub's compile, whose plan is dropped."""
    from crawlhub.hub.plan import compile_config

    compile_config(config)


def check_frontiers(config: CrawlhubConfig) -> None:
    """``key.function`` takes a Seed; ``segment_resolver`` is a resolver, or a class or
    factory taking ``seconds=``."""
    errors: list[ConfigError] = []
    for name, frontier in (config.frontier or {}).items():
        where: dict[str, Any] = {"file": config.file_of("frontier", name),
                                 "entry": f"frontier '{name}'"}
        try:
            if frontier.key.function:
                func = import_object(frontier.key.function, key="key.function", **where)
                check_call(func, what=f"key function {frontier.key.function!r}", args=("seed",),
                           key="key.function", **where)
            if frontier.segment_resolver:
                path = frontier.segment_resolver
                target = import_object(path, key="segment_resolver", **where)
                methods = ("segment_of", "start_of", "label")
                if inspect.isclass(target) or not hasattr(target, "segment_of"):
                    check_call(target, what=f"segment resolver {path!r}", kwargs=("seconds",),
                               methods=methods, key="segment_resolver", **where)
        except ConfigError as exc:
            errors.append(exc)
    _raise(errors)


def check_job_sinks(config: CrawlhubConfig) -> None:
    """Each collection job's sink as the job builds it (named after the job, keyed by its id field)."""
    if not config.jobs:
        return  # (and the sinks' models stay unimported: serve's start-up)
    from crawlhub.sinks.config import check_sink

    errors: list[ConfigError] = []
    for job in config.jobs:
        specs = [job.sink] + ([job.detail.sink] if job.detail.enabled and job.detail.sink else [])
        for spec in specs:
            data = {"name": job.name, "key": [job.source.id_field], **spec}
            try:
                check_sink(data, config=config.settings, name=job.name,
                           file=config.file_of("jobs", job.name), entry=f"job '{job.name}' sink")
            except ConfigError as exc:
                errors.append(exc)
    _raise(errors)


#: Backend URL scheme -> (client module, the extra that installs it, what it is).
_CLIENTS = {"redis": ("redis", "redis", "Redis"), "rediss": ("redis", "redis", "Redis"),
            "valkey": ("redis", "redis", "Valkey"), "valkeys": ("redis", "redis", "Valkey"),
            "postgres": ("asyncpg", "postgres", "PostgreSQL"),
            "postgresql": ("asyncpg", "postgres", "PostgreSQL")}
#: Sink type -> (client module, extra).
_SINK_CLIENTS = {"postgres": ("asyncpg", "postgres"), "redis_stream": ("redis", "redis"),
                 "kafka": ("aiokafka", "kafka")}
#: Inbound class family (``kafka.…``, ``redis.…``) -> (client module, extra).
_INBOUND_CLIENTS = {"kafka": ("aiokafka", "kafka"), "redis": ("redis", "redis")}


def check_extras(config: CrawlhubConfig) -> None:
    """Every backend the config names (storage URLs, job sinks, kafka and redis inbounds)
    has its client installed: else :class:`MissingExtraError` naming the first missing one
    and the ``pip install`` that adds it (checked once the config itself is right)."""
    from crawlhub.core.extras import require

    needs: list[tuple[str, str, str]] = []
    storage = config.storage
    for key in ("queues", "state", "frontier", "agents", "metadata"):
        url = getattr(storage, key)
        client = _CLIENTS.get(str(url or "").split("://", 1)[0].lower())
        if client is not None:
            needs.append((client[0], client[1], f"the {client[2]} backend of storage.{key}"))
    for job in config.jobs:
        specs = [job.sink] + ([job.detail.sink] if job.detail.enabled and job.detail.sink else [])
        for spec in specs:
            sink = _SINK_CLIENTS.get(str(spec.get("type") or ""))
            if sink is not None:
                needs.append((sink[0], sink[1], f"the {spec['type']} sink of job '{job.name}'"))
    for inbound in config.inbound:
        kind = inbound.class_.split(".", 1)[0]
        inbound_client = _INBOUND_CLIENTS.get(kind)
        if inbound_client is not None and not inbound.disable:
            needs.append((*inbound_client, f"the {kind} inbound '{inbound.name}'"))
    for module, extra, what in needs:
        require(module, extra, needed_by=what)


def _raise(errors: list[ConfigError]) -> None:
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)

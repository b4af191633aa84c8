"""Everything ``crawlhub check-config`` checks beyond the schema, without building anything:
the hub's compile (:func:`crawlhub.hub.plan.compile_config`: rules, selectors, classes
and converters), frontier key functions and segment resolvers, collection jobs' sinks.

User code is imported and inspected, never called (see :mod:`crawlhub.loading`); no
queue, state or connection is opened.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from crawlhub.errors import ConfigError, ConfigErrors
from crawlhub.loading import check_call, import_object

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
    from crawlhub.config.sinks import check_sink

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


def _raise(errors: list[ConfigError]) -> None:
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)

"""Assembling one run of a job from config: pipeline settings, sink, retries, fetcher.

The CollectJobManager and the CLI both build runs here, so a job behaves the same in both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from crawlhub.collect.config import CollectJobConfig
from crawlhub.collect.lease import DEFAULT_LEASE_TTL
from crawlhub.collect.runner import JobRun, _now
from crawlhub.collect.store.base import MetadataStore
from crawlhub.fetch.cancel import CancellationToken
from crawlhub.fetch.fetcher import Fetcher
from crawlhub.fetch.http import HttpClient, Transport
from crawlhub.fetch.joblog import JobLog, job_log
from crawlhub.fetch.retry import RetryPolicy
from crawlhub.fetch.scheduler import RequestScheduler
from crawlhub.pipeline.config import (
    PipelineConfig,
    PipelineSection,
    resolve_pipeline_config,
    split_section,
)
from crawlhub.sdk import Counters
from crawlhub.sinks.base import Sink
from crawlhub.sinks.config import build_sink

#: Scheduler keys a job may set under ``scheduler:`` (folded into its pipeline settings).
_SCHEDULER_KEYS = ("mode", "rate_min", "rate_max", "concurrency", "scope")


def job_pipeline_config(
    job: CollectJobConfig,
    section: PipelineSection | Mapping[str, Any] | None = None,
    *,
    env: Any = None,
    cli: Mapping[str, Any] | None = None,
) -> PipelineConfig:
    """The job's pipeline settings: defaults < ``pipeline.*`` < ``pipeline.<job>.*`` and
    the job's own ``pipeline:``/``scheduler:`` keys < env < CLI (see resolve_pipeline_config)."""
    if isinstance(section, PipelineSection):
        raw = section.raw()
    else:
        raw = dict(section or {})
    split = split_section(raw)
    own = dict(split["jobs"].get(job.name, {}))
    own.update(job.pipeline)
    sched = {
        key: getattr(job.scheduler, key)
        for key in job.scheduler.model_fields_set
        if key in _SCHEDULER_KEYS and getattr(job.scheduler, key) is not None
    }
    own.update(sched)
    merged = {**split["values"], **{k: v for k, v in split["jobs"].items() if k != job.name}}
    if own:
        merged[job.name] = own
    return resolve_pipeline_config(merged, job.name, env, cli)


def job_sink(job: CollectJobConfig, spec: Mapping[str, Any] | None = None, *,
             config: Any = None) -> Sink:
    """The job's sink (not opened): its ``sink:`` spec, named after the job, keyed by id."""
    data = dict(spec if spec is not None else job.sink)
    data.setdefault("name", job.name)
    data.setdefault("key", [job.source.id_field])
    return build_sink(data, config=config, name=job.name, entry=f"job '{job.name}' sink")


def job_retry(job: CollectJobConfig, pipeline: PipelineConfig, **overrides: Any) -> RetryPolicy:
    """Retries per the pipeline's ``tries``; API error codes per the source's error field."""
    options: dict[str, Any] = {"tries": pipeline.tries}
    if job.source.error_field:
        ok = tuple(job.source.ok_values)
        options["error_field"] = job.source.error_field
        options["ok_values"] = ok + tuple(str(v) for v in ok)
    options.update(overrides)
    return RetryPolicy(**options)


def scheduler_for(pipeline: PipelineConfig) -> RequestScheduler:
    return RequestScheduler.from_config(pipeline)


def new_run(
    job: CollectJobConfig,
    *,
    store: MetadataStore,
    config: Any = None,
    section: PipelineSection | Mapping[str, Any] | None = None,
    scheduler: RequestScheduler | None = None,
    token: CancellationToken | None = None,
    client: Transport | None = None,
    retry: RetryPolicy | None = None,
    sink: Sink | None = None,
    detail_sink: Sink | None = None,
    env: Any = None,
    cli: Mapping[str, Any] | None = None,
    log: JobLog | None = None,
    now: Callable[[], datetime] = _now,
    run_id: str | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    control: Any = None,
    counters: Counters | None = None,
) -> JobRun:
    """A ready ``JobRun`` for ``job``; ``config`` is the CrawlhubConfig (or app settings).
    ``control`` / ``counters``: pause, continue, exit and the run's counters (JobRun)."""
    if section is None and config is not None:
        section = getattr(config, "pipeline", None)
    settings = getattr(config, "settings", None) or config
    if env is None:
        env = getattr(config, "settings", None)
    pipeline = job_pipeline_config(job, section, env=env, cli=cli)
    scheduler = scheduler or scheduler_for(pipeline)
    scheduler.register(job.name, rate_min=pipeline.rate_min, rate_max=pipeline.rate_max)
    closers: list[Callable[[], Awaitable[None]]] = []
    if client is None:
        http = HttpClient(timeout=pipeline.timeout, headers=job.source.headers)
        closers.append(http.close)
        client = http
    log = log or job_log(job.name)
    fetcher = Fetcher(
        client,
        scheduler,
        retry or job_retry(job, pipeline),
        job_code=job.name,
        token=token or CancellationToken(),
        logger=log,
        max_consecutive_failures=pipeline.max_consecutive_failures,
        timeout=pipeline.timeout,
    )
    if sink is None:
        sink = job_sink(job, config=_sink_settings(config, settings))
    if detail_sink is None and job.detail.enabled and job.detail.sink is not None:
        detail_sink = job_sink(job, job.detail.sink, config=_sink_settings(config, settings))
    return JobRun(
        job,
        store=store,
        fetcher=fetcher,
        sink=sink,
        pipeline=pipeline,
        detail_sink=detail_sink,
        log=log,
        now=now,
        run_id=run_id,
        closers=closers,
        lease_ttl=lease_ttl,
        control=control,
        counters=counters,
    )


def _sink_settings(config: Any, settings: Any) -> Any:
    """What ``build_sink`` reads: data_dir from the config, connections from settings."""
    if config is None:
        return None
    data_dir = getattr(config, "data_dir", None)
    if settings is not None and settings is not config and data_dir is not None:
        return _Layered(settings, {"data_dir": data_dir})
    return config


class _Layered:
    """Attribute lookup on ``first`` values, then on ``settings``."""

    def __init__(self, settings: Any, first: dict[str, Any]) -> None:
        self._settings = settings
        self._first = first

    def get(self, name: str) -> Any:
        if name in self._first:
            return self._first[name]
        value = getattr(self._settings, name, None)
        if value is None and callable(getattr(self._settings, "get", None)):
            value = self._settings.get(name)
        return value

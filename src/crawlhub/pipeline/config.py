"""The ``pipeline`` config section and how one job's pipeline settings are resolved.

Keys (``workers, queue_size, batch_size, batch_timeout, rate_min, rate_max`` and a few
more) sit under ``pipeline.*`` with per-job overrides under ``pipeline.<job>.*``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from crawlhub.core.errors import ConfigError


class PipelineConfigError(ConfigError, ValueError):
    """A pipeline setting has a bad value; a ``ValueError`` too, naming key and value."""


class PipelineConfig(BaseModel):
    """One job's resolved pipeline settings (defaults from seed 002)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = 2  # processing pool workers
    queue_size: int = 100  # processing queue capacity (backpressure when full)
    batch_size: int = 100  # writer flushes at this many records ...
    batch_timeout: float = 5.0  # ... or this many seconds after a batch's first record
    rate_min: float = 5.0  # serial mode: gap between requests drawn from [rate_min, rate_max]
    rate_max: float = 20.0
    mode: Literal["serial", "concurrent"] = "serial"
    scope: Literal["global", "job", "domain"] = "global"
    concurrency: int = 4  # concurrent mode: requests in flight per scope
    rate_per_second: float | None = None  # concurrent mode: token bucket rate (None = off)
    burst: int = 1  # concurrent mode: token bucket size
    tries: int = 3  # attempts per request, the first included
    timeout: float = 30.0  # seconds per attempt
    max_consecutive_failures: int = 10  # more failed requests in a row end the run FAILED
    progress_interval: float = 10.0  # seconds between progress log lines (0 = off)

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return check_values(data, where="pipeline", complete=True)
        return data


#: The keys a ``pipeline`` section (or a job's override) may set.
PIPELINE_KEYS: tuple[str, ...] = tuple(PipelineConfig.model_fields)

#: CLI flag -> key, for every command that runs pipelines.
CLI_FLAGS: dict[str, str] = {
    "--pipeline-workers": "workers",
    "--pipeline-batch-size": "batch_size",
    "--pipeline-rate-min": "rate_min",
    "--pipeline-rate-max": "rate_max",
}

_INTS_AT_LEAST_1 = ("workers", "queue_size", "batch_size", "concurrency", "burst", "tries",
                    "max_consecutive_failures")
_SECONDS = ("batch_timeout", "rate_min", "rate_max", "timeout", "progress_interval")
_CHOICES: dict[str, tuple[str, ...]] = {
    "mode": ("serial", "concurrent"),
    "scope": ("global", "job", "domain"),
}


def _fail(where: str, key: str, value: Any, why: str, source: str | None) -> PipelineConfigError:
    origin = f" (from {source})" if source else ""
    return PipelineConfigError(f"value {value!r}{origin} {why}", key=f"{where}.{key}")


def check_values(
    values: Mapping[str, Any],
    *,
    where: str = "pipeline",
    sources: Mapping[str, str] | None = None,
    complete: bool = False,
) -> dict[str, Any]:
    """Coerce (strings from .env files and flags) and check values; errors name key and value.

    Raises ``PipelineConfigError`` (a ``ValueError``): ``workers``, ``queue_size``,
    ``batch_size`` and the other counts must be integers >= 1, times numbers >= 0 (the
    timeout > 0), and ``rate_min <= rate_max`` (checked when both are given, or always
    with ``complete``, where a missing one is its default).
    """
    sources = sources or {}
    out: dict[str, Any] = {}
    for key, value in values.items():
        src = sources.get(key)
        if key not in PIPELINE_KEYS:
            hint = difflib.get_close_matches(key, PIPELINE_KEYS, n=1)
            why = f"is set on an unknown key; did you mean '{hint[0]}'?" if hint else (
                f"is set on an unknown key; known keys: {', '.join(PIPELINE_KEYS)}")
            raise _fail(where, key, value, why, src)
        if key in _INTS_AT_LEAST_1:
            number = _as_int(value)
            if number is None or number < 1:
                raise _fail(where, key, value, "must be an integer >= 1", src)
            out[key] = number
        elif key in _SECONDS or key == "rate_per_second":
            if value is None and key == "rate_per_second":
                out[key] = None
                continue
            seconds = _as_float(value)
            if seconds is None or seconds < 0:
                raise _fail(where, key, value, "must be a number >= 0", src)
            if key in ("timeout", "rate_per_second") and seconds == 0:
                raise _fail(where, key, value, "must be a number > 0", src)
            out[key] = seconds
        elif key in _CHOICES:
            text = str(value).strip().lower()
            if text not in _CHOICES[key]:
                raise _fail(where, key, value, f"must be one of {', '.join(_CHOICES[key])}", src)
            out[key] = text
        else:  # pragma: no cover - every key is in one group above
            out[key] = value
    if complete or ("rate_min" in out and "rate_max" in out):
        low = out.get("rate_min", PipelineConfig.model_fields["rate_min"].default)
        high = out.get("rate_max", PipelineConfig.model_fields["rate_max"].default)
        if low > high:
            src = sources.get("rate_min") or sources.get("rate_max")
            raise _fail(
                where, "rate_min", low,
                f"is greater than {where}.rate_max={high!r}: the gap between two requests is "
                "drawn from [rate_min, rate_max]; set rate_min <= rate_max", src,
            )
    return out


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().removesuffix("s")
        try:
            number = float(text)
        except ValueError:
            return None
    else:
        return None
    return None if math.isnan(number) or math.isinf(number) else number


class PipelineSection(BaseModel):
    """The ``pipeline`` section of the config file: global keys plus ``<job>: {...}``.

    ``pipeline: {workers: 4, rate_min: 1, orders: {workers: 8}}`` sets every job's workers
    to 4 and job ``orders``'s to 8. A key that is neither a setting nor a mapping (a job)
    is an error that names it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    values: dict[str, Any] = Field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        return split_section(data)

    @model_serializer
    def _as_written(self) -> dict[str, Any]:
        return self.raw()

    def raw(self) -> dict[str, Any]:
        """The section as written: global keys plus one mapping per job."""
        return {**self.values, **{job: dict(v) for job, v in self.jobs.items()}}


def split_section(data: Any) -> dict[str, Any]:
    """``{"values": {...}, "jobs": {job: {...}}}`` from a raw ``pipeline`` mapping, checked."""
    if data is None:
        return {"values": {}, "jobs": {}}
    if not isinstance(data, Mapping):
        raise PipelineConfigError(f"must be a mapping of settings, got {data!r}", key="pipeline")
    if set(data) <= {"values", "jobs"} and all(isinstance(v, Mapping) for v in data.values()):
        return {"values": dict(data.get("values", {})), "jobs": dict(data.get("jobs", {}))}
    values: dict[str, Any] = {}
    jobs: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        key = str(key)
        if isinstance(value, Mapping):
            jobs[key] = check_values(dict(value), where=f"pipeline.{key}")
        else:
            values[key] = value
    return {"values": check_values(values), "jobs": jobs}


class _Lookup(Protocol):
    """What a settings layer offers: ``Settings`` from ``crawlhub.config.settings``."""

    def get(self, name: str) -> str | None: ...


def _env_names(key: str, job: str | None) -> list[str]:
    if job is None:
        return [f"pipeline.{key}", f"pipeline__{key}", f"pipeline_{key}"]
    return [f"pipeline.{job}.{key}", f"pipeline__{job}__{key}"]


def _env_get(env: _Lookup | Mapping[str, str], name: str) -> tuple[str, str] | None:
    if isinstance(env, Mapping):
        lowered = {str(k).lower(): (str(k), v) for k, v in env.items()}
        for candidate in (f"crawlhub_{name}", name):
            hit = lowered.get(candidate.lower())
            if hit is not None and hit[1] is not None:
                return hit[0], str(hit[1])
        return None
    value = env.get(name)
    if value is None:
        return None
    source_of = getattr(env, "source_of", None)
    source = source_of(name) if callable(source_of) else None
    return source or f"setting {name}", value


def resolve_pipeline_config(
    config_section: PipelineSection | Mapping[str, Any] | None = None,
    job: str | None = None,
    env: _Lookup | Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
) -> PipelineConfig:
    """The settings of ``job`` (or the global ones when None), from every layer.

    Layers, lowest first: built-in defaults < config file ``pipeline`` section < ``.env`` <
    ``.env.local`` < environment < CLI. ``env`` is a ``Settings`` (which already layers
    ``.env`` < ``.env.local`` < environment, see ``load_settings``) or a plain mapping
    such as ``os.environ``. Names there: ``CRAWLHUB_PIPELINE__WORKERS`` (or
    ``PIPELINE_WORKERS``, ``pipeline.workers``) for every job, and
    ``CRAWLHUB_PIPELINE__<JOB>__WORKERS`` (or ``pipeline.<job>.workers``) for one job.
    ``cli`` maps keys to values (``{"workers": 4}``; ``None`` = flag not given); a key
    ``"<job>.<key>"`` targets one job.

    For each key, a per-job value from any layer wins over a global one (the seed's rule:
    ``pipeline.<job>.*``, falling back to ``pipeline.*``); within the same kind the higher
    layer wins. Bad values raise ``PipelineConfigError`` (a ``ValueError``) naming the
    key, the value and where it came from.
    """
    if config_section is None:
        section = PipelineSection()
    elif isinstance(config_section, PipelineSection):
        section = config_section
    else:
        section = PipelineSection.model_construct(**split_section(config_section))
    cli = {k: v for k, v in (cli or {}).items() if v is not None}

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    job_where = f"pipeline.{job}" if job else "pipeline"
    for key in PIPELINE_KEYS:
        found = _pick(key, job, section, env, cli)
        if found is not None:
            values[key], sources[key] = found
    checked = check_values(values, where=job_where, sources=sources, complete=True)
    return PipelineConfig(**checked)


def _pick(
    key: str,
    job: str | None,
    section: PipelineSection,
    env: _Lookup | Mapping[str, str] | None,
    cli: Mapping[str, Any],
) -> tuple[Any, str] | None:
    scopes: list[str | None] = [job, None] if job else [None]
    for scope in scopes:  # per-job first, then global
        cli_key = f"{scope}.{key}" if scope else key
        if cli_key in cli:
            flag = next((f for f, k in CLI_FLAGS.items() if k == key), f"--pipeline-{key}")
            return cli[cli_key], f"CLI {flag}" if scope is None else f"CLI {cli_key}"
        if env is not None:
            for name in _env_names(key, scope):
                hit = _env_get(env, name)
                if hit is not None:
                    return hit[1], hit[0]
        layer = section.jobs.get(scope, {}) if scope else section.values
        if scope and scope not in section.jobs:
            # job codes are matched case-insensitively, like environment names
            layer = next((v for k, v in section.jobs.items() if k.lower() == scope.lower()), {})
        if key in layer:
            return layer[key], f"config {'pipeline.' + scope if scope else 'pipeline'}.{key}"
    return None


def cli_overrides(
    workers: int | None = None,
    batch_size: int | None = None,
    rate_min: float | None = None,
    rate_max: float | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The ``cli`` mapping from the ``--pipeline-*`` flags (None = flag not given)."""
    given = {"workers": workers, "batch_size": batch_size, "rate_min": rate_min,
             "rate_max": rate_max, **more}
    return {k: v for k, v in given.items() if v is not None}

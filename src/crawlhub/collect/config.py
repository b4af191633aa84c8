"""The config model of collection jobs (`jobs:` in the crawlhub config file).

A job = a paged JSON source + a strategy + pipeline overrides + a sink spec; validation
errors name the job and the key.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from crawlhub.core.durations import parse_duration
from crawlhub.core.errors import ConfigError


def _to_timedelta(value: Any) -> timedelta:
    """A config duration (seconds, or ``"30s"``, ``"15m"``, ``"1h"``, ``"1d"``, ``"1w"``;
    ISO 8601 such as ``"PT1H"`` too, which is how a dumped config writes it)."""
    if isinstance(value, timedelta):
        return value
    try:
        return timedelta(seconds=parse_duration(value))
    except ValueError:
        if isinstance(value, str) and value.strip().upper().startswith(("P", "-P")):
            return _TIMEDELTA.validate_python(value.strip())
        raise


_TIMEDELTA: TypeAdapter[timedelta] = TypeAdapter(timedelta)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PaginationConfig(_Model):
    """How pages are addressed: ``offset`` (offset/limit), ``page`` (page/size) or
    ``window`` (one request per time segment, ``from``/``to`` params, no paging)."""

    type: Literal["offset", "page", "window"] = "offset"
    offset_param: str = "offset"
    limit_param: str = "limit"
    page_param: str = "page"
    size_param: str = "size"
    start_page: int = 1
    window_param_from: str = "from"
    window_param_to: str = "to"
    window_format: str = "iso"
    window: timedelta = timedelta(days=1)
    segment: timedelta = timedelta(hours=1)

    @field_validator("window", "segment", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> timedelta:
        return _to_timedelta(v)

    @field_validator("segment", "window")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be a positive duration")
        return v


class SourceConfig(_Model):
    """The paged JSON source: request shape and where things sit in the response."""

    url: str
    method: Literal["GET", "POST"] = "GET"
    params: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    params_in: Literal["query", "json"] | None = None
    pagination: PaginationConfig = Field(default_factory=PaginationConfig)
    items_path: str = "items"
    total_path: str | None = "total"
    id_field: str = "id"
    date_field: str | None = None
    date_format: str = "iso"
    error_field: str | None = None
    ok_values: list[Any] = Field(default_factory=lambda: [0])
    timeout: float = 30.0

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v

    @property
    def params_location(self) -> Literal["query", "json"]:
        return self.params_in or ("json" if self.method == "POST" else "query")


class StrategyConfig(_Model):
    """How a run walks the source: ``incremental`` (newest first, seed 000), ``window``
    (time segments, forward, each committed as a unit) or ``full`` (forward scan)."""

    type: Literal["incremental", "window", "full"] = "incremental"
    batch_size: int = Field(default=100, ge=1)
    filter_days: float | None = Field(default=None, gt=0)
    max_expired_batches: int = Field(default=3, ge=1)
    overlap: int = Field(default=0, ge=0)
    lag: timedelta = timedelta(0)

    @field_validator("lag", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> timedelta:
        return _to_timedelta(v)


class DetailConfig(_Model):
    """Optional detail mode: after the list, fetch ``url`` (with ``{id}``) per item id."""

    enabled: bool = False
    url: str | None = None
    method: Literal["GET", "POST"] = "GET"
    params: dict[str, Any] = Field(default_factory=dict)
    item_path: str | None = "data"
    sink: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _url_when_enabled(self) -> DetailConfig:
        if self.enabled and (not self.url or "{id}" not in self.url):
            raise ValueError(
                "detail.url must be set and contain '{id}' when detail is enabled "
                "(in a config file write '{{id}}': single braces are placeholders)"
            )
        return self


class SchedulerConfig(_Model):
    """Request pacing of this job, folded into its pipeline settings (``pipeline.<job>``)."""

    mode: Literal["serial", "concurrent"] = "serial"
    rate_min: float | None = Field(default=None, ge=0)
    rate_max: float | None = Field(default=None, ge=0)
    concurrency: int = Field(default=4, ge=1)
    scope: Literal["global", "job", "domain"] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> SchedulerConfig:
        if (
            self.rate_min is not None
            and self.rate_max is not None
            and self.rate_min > self.rate_max
        ):
            raise ValueError(f"rate_min {self.rate_min} > rate_max {self.rate_max}")
        return self


class CollectJobConfig(_Model):
    """One collection job (an entry of the config's ``jobs:``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")
    enabled: bool = True
    auto_start: bool = False
    source: SourceConfig
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    detail: DetailConfig = Field(default_factory=DetailConfig)
    pipeline: dict[str, Any] = Field(default_factory=dict)
    sink: dict[str, Any] = Field(default_factory=lambda: {"type": "jsonl"})
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)

    @model_validator(mode="after")
    def _strategy_fits_pagination(self) -> CollectJobConfig:
        kind = self.source.pagination.type
        if self.strategy.type == "incremental" and kind != "offset":
            raise ValueError(
                f"strategy.type incremental walks offsets back from the total; it needs "
                f"source.pagination.type offset, not {kind}"
            )
        if self.strategy.type == "incremental" and not self.source.total_path:
            raise ValueError("strategy.type incremental needs source.total_path")
        if self.strategy.type == "full" and kind == "window":
            raise ValueError("strategy.type full needs offset or page pagination, not window")
        if self.strategy.filter_days is not None and not self.source.date_field:
            raise ValueError("strategy.filter_days needs source.date_field")
        return self




def load_job(data: Any, *, file: str | None = None, index: int | None = None
             ) -> CollectJobConfig:
    """Validate one job entry; a bad key is a ``ConfigError`` naming the job and the key."""
    try:
        return CollectJobConfig.model_validate(data)
    except ValidationError as exc:
        raise job_config_error(exc, data, file=file, index=index) from None


def job_config_error(
    exc: ValidationError, data: Any, *, file: str | None = None, index: int | None = None
) -> ConfigError:
    """The first pydantic error as a ConfigError naming the job (``jobs[i] 'name'``) and key."""
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or None
    name = data.get("name") if isinstance(data, dict) else None
    entry = f"jobs[{index}]" if index is not None else "job"
    if name:
        entry += f" '{name}'"
    return ConfigError(f"{err['msg']} (got {err.get('input')!r})", file=file, entry=entry, key=key)

"""Config models of the frontier section: one FrontierConfig per named frontier.

``frontier: {news: {segment: 1d, key: {...}}}`` in YAML; the mapping key is the name.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from crawlhub.core.configtypes import Duration, new_list

#: Query parameters no page depends on: JSONP callbacks, cache busters, campaign tags.
DEFAULT_VOLATILE_PARAMS: tuple[str, ...] = (
    "callback",
    "jsonp",
    "jsonpcallback",
    "_",
    "utm_*",
    "gclid",
    "fbclid",
)


def _as_list(value: Any) -> Any:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return value


StrList = Annotated[list[str], BeforeValidator(_as_list)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DomainKeyRules(_Model):
    """Key rules of one domain and its subdomains (the most specific domain wins)."""

    #: Parameters never dropped (glob patterns, case-insensitive).
    keep_params: StrList = Field(default_factory=new_list)
    #: Parameters dropped on this domain, in addition to the global ones.
    drop_params: StrList = Field(default_factory=new_list)
    #: When set, every parameter not matching one of these is dropped (an allowlist).
    only_params: StrList | None = None
    #: False: the path is lower-cased in the key (servers that ignore path case).
    case_sensitive_path: bool = True
    #: None: inherit the global setting.
    drop_timestamp_values: bool | None = None


class KeyConfig(_Model):
    """How a seed's dedup key is built (see crawlhub.frontier.urlkeys.KeyResolver)."""

    #: Dropped everywhere (glob patterns, case-insensitive). Replaces the defaults.
    volatile_params: StrList = Field(default_factory=lambda: list(DEFAULT_VOLATILE_PARAMS))
    #: Dropped everywhere, in addition to ``volatile_params``.
    drop_params: StrList = Field(default_factory=new_list)
    #: Never dropped (wins over every drop rule).
    keep_params: StrList = Field(default_factory=new_list)
    #: Drop a parameter whose value looks like a Unix time in seconds or milliseconds
    #: between 2000 and 2050 (``t=1700000000``, ``_=1700000000123``).
    drop_timestamp_values: bool = True
    domains: dict[str, DomainKeyRules] = Field(default_factory=dict)
    #: Put the HTTP method in the key (a POST and a GET of one URL differ).
    include_method: bool = False
    #: Put a hash of the body in the key (POST searches with different forms differ).
    include_body: bool = False
    #: ``package.module:function`` taking a Seed and returning its key; replaces all rules.
    function: str | None = None

    @field_validator("domains", mode="before")
    @classmethod
    def _domains(cls, value: Any) -> Any:
        if value is None:
            return {}
        if isinstance(value, dict):
            return {
                str(k).lower().strip(".").removeprefix("*."): ({} if v is None else v)
                for k, v in value.items()
            }
        return value


class FrontierConfig(_Model):
    """One frontier: dedup keys, time segments, the bloom filter and dispatch settings."""

    #: Length of a time segment: a key is admitted once per segment (``6h``, ``1d``, ``1w``).
    segment: Duration = 86400.0
    #: ``package.module:object`` replacing the time segments (see frontier.segments).
    segment_resolver: str | None = None
    #: Distinct keys expected per segment: sizes the first bloom layer.
    expected_items: int = Field(default=1_000_000, ge=1)
    #: Bound on the false-positive rate of the whole (growing) bloom filter.
    fp_rate: float = Field(default=1e-3, gt=0, lt=1)
    #: Confirm bloom positives against the store (no false positives, one lookup each).
    exact: bool = False
    #: Task field holding the URL when the hub admits tasks.
    url_field: str = "url"
    key: KeyConfig = Field(default_factory=KeyConfig)
    #: How often the embedded bloom filter is snapshotted to disk.
    snapshot_interval: Duration = 60.0
    #: Default visibility timeout of a leased seed.
    lease_timeout: Duration = 300.0
    #: Seeds leased from the store per batch into the in-memory dispatch cache (0: off).
    cache_size: int = Field(default=100, ge=0)
    #: Finished segments older than this many segments are pruned (0: keep forever).
    retain_segments: int = Field(default=0, ge=0)
    #: Keep the record of every finished seed (the archive). False (Redis): a seed
    #: finished ok or failed drops its record and the filter alone remembers its key,
    #: about 2 bytes per URL instead of the whole request; needs ``exact: false``.
    archive: bool = True

    @model_validator(mode="before")
    @classmethod
    def _none_is_default(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _archive_needs_filter(self) -> FrontierConfig:
        if not self.archive and self.exact:
            raise ValueError("archive: false drops the records exact: true checks against;"
                             " use one of them")
        return self

    @field_validator("segment")
    @classmethod
    def _segment_positive(cls, value: float) -> float:
        if value < 1:
            raise ValueError(f"segment must be at least 1s, got {value}s: use e.g. '6h' or '1d'")
        return value

    @field_validator("key", mode="before")
    @classmethod
    def _key_none(cls, value: Any) -> Any:
        return {} if value is None else value

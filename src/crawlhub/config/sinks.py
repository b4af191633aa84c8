"""Sink config models and ``build_sink``: a ``sink:`` mapping from YAML to a ready ``Sink``.

``type`` picks the sink (``jsonl``, ``postgres``, ``redis_stream``, ``kafka``) or names a
user class by import path (``package.module:Class``); a bad key is a ``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from crawlhub.errors import ConfigError
from crawlhub.keys import DEFAULT_PREFIX

if TYPE_CHECKING:
    from crawlhub.sinks.base import Sink

SINK_TYPES = ("jsonl", "postgres", "redis_stream", "kafka")


def _key_list(value: Any) -> Any:
    """``key: id`` and ``key: [shop_id, id]`` both work."""
    return [value] if isinstance(value, str) else value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SinkConfig(_Model):
    """What every sink has: its name, the record fields forming the key, hash exclusions."""

    type: str
    name: str | None = None
    key: list[str] = Field(default_factory=lambda: ["id"], min_length=1)
    #: Fields stored but not hashed: a change in them alone is not an update.
    hash_exclude: list[str] = Field(default_factory=list)

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> Any:
        return _key_list(value)


class JsonlSinkConfig(SinkConfig):
    """Append-only JSON lines file with a SQLite sidecar index of written keys and hashes."""

    type: Literal["jsonl"] = "jsonl"
    path: Path
    #: Sidecar index; default ``<path>.index.sqlite``.
    index_path: Path | None = None
    fsync: bool = True

    @property
    def index_file(self) -> Path:
        return self.index_path or self.path.with_name(self.path.name + ".index.sqlite")


class RedisStreamSinkConfig(SinkConfig):
    """XADD to a Redis stream; a hash of written keys makes redelivery a no-op."""

    type: Literal["redis_stream"] = "redis_stream"
    url: str
    stream: str = Field(min_length=1)
    #: Trim the stream to about this many entries (``MAXLEN ~``); None keeps everything.
    maxlen: int | None = Field(default=None, ge=1)
    approximate: bool = True
    prefix: str = DEFAULT_PREFIX


class PgTableConfig(_Model):
    """One PostgreSQL target table.

    ``columns`` maps record fields to their own columns (a list maps same-named ones);
    when omitted, record fields matching an existing column of the table are written
    there. The whole record data always goes to the JSONB ``data`` column if the table has
    one. ``mode: scd2`` keeps versions (``valid_from, valid_to, is_current``) instead of
    updating rows in place.
    """

    table: str = Field(min_length=1)
    #: The value of ``route_field`` that selects this table; default the table name.
    name: str | None = None
    key: list[str] = Field(default_factory=lambda: ["id"], min_length=1)
    columns: dict[str, str] | None = None
    #: SQL types of columns created by ``create: true`` (default ``text``).
    types: dict[str, str] = Field(default_factory=dict)
    create: bool = True
    mode: Literal["upsert", "scd2"] = "upsert"
    hash_exclude: list[str] = Field(default_factory=list)

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> Any:
        return _key_list(value)

    @field_validator("columns", mode="before")
    @classmethod
    def _columns(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return {str(v): str(v) for v in value}
        return value

    @property
    def route_name(self) -> str:
        return self.name or self.table


class PostgresSinkConfig(SinkConfig):
    """Upsert (or SCD2-merge) records into PostgreSQL tables via COPY into a staging table.

    One table: give ``table`` (and ``columns``, ``types``, ``create``, ``mode``) at the top
    level. Several: list ``tables`` and set ``route_field``, the record field naming the
    table; tables merge in parallel (``parallel_workers``), each in its own transaction.
    """

    type: Literal["postgres"] = "postgres"
    url: str
    tables: list[PgTableConfig] = Field(default_factory=list)
    route_field: str | None = None
    parallel_workers: int = Field(default=4, ge=1)
    #: Every run is a full snapshot: rows not delivered get ``deleted_at`` at close.
    full_snapshot: bool = False

    @model_validator(mode="before")
    @classmethod
    def _single_table(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "table" not in data and data.get("tables"):
            # tables inherit the top-level key and hash_exclude they do not set
            inherited = {f: data[f] for f in ("key", "hash_exclude") if f in data}
            tables = [
                {**inherited, **t} if isinstance(t, Mapping) else t for t in data["tables"]
            ]
            return {**data, "tables": tables}
        if not isinstance(data, Mapping) or "table" not in data:
            return data
        data = dict(data)
        if data.get("tables"):
            raise ValueError("give either 'table' (one table) or 'tables' (several), not both")
        table = {"table": data.pop("table")}
        for field in ("columns", "types", "create", "mode"):
            if field in data:
                table[field] = data.pop(field)
        for field in ("key", "hash_exclude"):
            if field in data:
                table[field] = data[field]
        data["tables"] = [table]
        return data

    @model_validator(mode="after")
    def _tables(self) -> PostgresSinkConfig:
        if not self.tables:
            raise ValueError("name the target: 'table: <name>' or a 'tables:' list")
        names = [t.route_name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names repeat: {names}; give each a distinct 'name'")
        if len(self.tables) > 1 and not self.route_field:
            raise ValueError("several tables need 'route_field', the record field naming the table")
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return postgres_dsn(value)


class KafkaSinkConfig(SinkConfig):
    """Produce each record to a topic, message key = record key, value = JSON."""

    type: Literal["kafka"] = "kafka"
    bootstrap_servers: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    #: Idempotent producer (acks=all, no duplicates from producer retries). Brokers without
    #: InitProducerId v0 support (e.g. Tansu 0.6) need ``idempotence: false``.
    idempotence: bool = True
    acks: Literal["all", 0, 1, -1] = "all"
    #: More producer settings, librdkafka style (``linger.ms``, ``compression.type``...).
    settings: dict[str, Any] = Field(default_factory=dict)


_MODELS: dict[str, type[SinkConfig]] = {
    "jsonl": JsonlSinkConfig,
    "postgres": PostgresSinkConfig,
    "redis_stream": RedisStreamSinkConfig,
    "kafka": KafkaSinkConfig,
}

#: Settings read when the spec leaves a connection out (first one set wins).
_DEFAULTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "postgres": ("url", ("postgres_url", "database_url")),
    "redis_stream": ("url", ("redis_url",)),
    "kafka": ("bootstrap_servers", ("kafka_bootstrap_servers", "kafka_bootstrap")),
}


def postgres_dsn(url: str) -> str:
    """A PostgreSQL URL asyncpg accepts: SQLAlchemy's ``postgresql+asyncpg://`` is converted."""
    for prefix in ("postgresql+asyncpg://", "postgresql+psycopg://", "postgres+asyncpg://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def _setting(config: Any, name: str) -> Any:
    """Read ``name`` from the app settings (a ``Settings``, a mapping or any object)."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get(name)
    value = getattr(config, name, None)
    if value is None and callable(getattr(config, "get", None)):
        value = config.get(name)
    return value


def sink_config(
    spec: Mapping[str, Any],
    *,
    config: Any = None,
    name: str | None = None,
    file: str | None = None,
    entry: str | None = None,
) -> SinkConfig:
    """Validate a built-in sink spec into its model, filling defaults from the settings."""
    data = dict(spec)
    kind = data.get("type", "jsonl")
    data["type"] = kind
    where = entry or f"sink '{data.get('name') or name or kind}'"
    model = _MODELS.get(kind)
    if model is None:
        raise ConfigError(
            f"unknown sink type {kind!r}; use one of {', '.join(SINK_TYPES)} or an import "
            "path such as 'package.module:MySink'",
            file=file,
            entry=where,
            key="type",
        )
    data.setdefault("name", name or kind)
    if kind in _DEFAULTS:
        field, names = _DEFAULTS[kind]
        if not data.get(field):
            for setting in names:
                value = _setting(config, setting)
                if value:
                    data[field] = value
                    break
    if kind == "jsonl":
        data_dir = Path(str(_setting(config, "data_dir") or "."))
        path = Path(str(data.get("path") or Path("sinks") / f"{data['name']}.jsonl"))
        data["path"] = path if path.is_absolute() else data_dir / path
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or None
        hint = ""
        if kind in _DEFAULTS and key == _DEFAULTS[kind][0]:
            hint = f"; or set {' / '.join(_DEFAULTS[kind][1])} in the settings"
        got = f" (got {err['input']!r:.80})" if err["type"] != "missing" else ""
        raise ConfigError(f"{err['msg']}{got}{hint}", file=file, entry=where, key=key) from None


def build_sink(
    spec: Mapping[str, Any],
    *,
    config: Any = None,
    name: str | None = None,
    file: str | None = None,
    entry: str | None = None,
) -> Sink:
    """Build the sink a ``sink:`` mapping describes (not yet opened).

    ``config`` is the app ``Settings`` (or a mapping): ``data_dir`` anchors relative JSON
    lines paths (default ``<data_dir>/sinks/<name>.jsonl``), and ``postgres_url``,
    ``redis_url``, ``kafka_bootstrap_servers`` fill a spec that leaves its connection out.
    A user class named by import path is called with the spec's other keys.
    """
    kind = str(spec.get("type", "jsonl"))
    if kind not in _MODELS and ("." in kind or ":" in kind):
        return _user_sink(kind, spec, file=file, entry=entry or f"sink '{name or kind}'")
    model = sink_config(spec, config=config, name=name, file=file, entry=entry)
    sink_name = model.name or kind
    if isinstance(model, JsonlSinkConfig):
        from crawlhub.sinks.jsonl import JsonlSink

        return JsonlSink(model, name=sink_name)
    if isinstance(model, PostgresSinkConfig):
        from crawlhub.sinks.postgres import PostgresSink

        return PostgresSink(model, name=sink_name)
    if isinstance(model, RedisStreamSinkConfig):
        from crawlhub.sinks.redis_stream import RedisStreamSink

        return RedisStreamSink(model, name=sink_name)
    assert isinstance(model, KafkaSinkConfig)
    from crawlhub.sinks.kafka import KafkaSink

    return KafkaSink(model, name=sink_name)


def check_sink(
    spec: Mapping[str, Any],
    *,
    config: Any = None,
    name: str | None = None,
    file: str | None = None,
    entry: str | None = None,
) -> None:
    """What :func:`build_sink` would refuse, without building: a built-in spec is
    validated, a user class imported and inspected (never instantiated)."""
    kind = str(spec.get("type", "jsonl"))
    if kind not in _MODELS and ("." in kind or ":" in kind):
        from crawlhub.loading import check_call, import_object

        where = entry or f"sink '{name or kind}'"
        cls = import_object(kind, file=file, entry=where, key="type")
        check_call(cls, what=f"sink class {kind!r}", kwargs=[str(k) for k in spec if k != "type"],
                   methods=("open", "write_batch", "close"), file=file, entry=where, key="type")
        return
    sink_config(spec, config=config, name=name, file=file, entry=entry)


def _user_sink(path: str, spec: Mapping[str, Any], *, file: str | None, entry: str) -> Sink:
    from crawlhub.loading import import_object
    from crawlhub.sinks.base import Sink

    cls = import_object(path, file=file, entry=entry, key="type")
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    try:
        sink = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"sink class {path!r} rejected its settings: {exc}", file=file, entry=entry) from None
    if not isinstance(sink, Sink):
        raise ConfigError(
            f"{path!r} is not a sink: it needs name, open(), write_batch(records), close()",
            file=file,
            entry=entry,
            key="type",
        )
    return sink

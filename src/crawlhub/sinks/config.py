"""``build_sink``: a ``sink:`` mapping from YAML to a ready ``Sink``.

``type`` picks the sink (``jsonl``, ``sqlite``, ``postgres``, ``redis_stream``, ``kafka``) or names a
user class by import path (``package.module:Class``); a bad key is a ``ConfigError``.
Each sink owns its config model (beside it in :mod:`crawlhub.sinks`); this module only
refers to them, fills connections from the settings and builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from crawlhub.core.errors import ConfigError
from crawlhub.sinks.base import Sink, SinkConfig
from crawlhub.sinks.jsonl import JsonlSinkConfig
from crawlhub.sinks.kafka import KafkaSinkConfig
from crawlhub.sinks.pg_table import PgTableConfig
from crawlhub.sinks.postgres import PostgresSinkConfig, postgres_dsn
from crawlhub.sinks.redis_stream import RedisStreamSinkConfig
from crawlhub.sinks.sqlite import SqliteSinkConfig

__all__ = [
    "SINK_TYPES",
    "JsonlSinkConfig",
    "KafkaSinkConfig",
    "PgTableConfig",
    "PostgresSinkConfig",
    "RedisStreamSinkConfig",
    "SqliteSinkConfig",
    "SinkConfig",
    "build_sink",
    "check_sink",
    "postgres_dsn",
    "sink_config",
]

SINK_TYPES = ("jsonl", "sqlite", "postgres", "redis_stream", "kafka")


_MODELS: dict[str, type[SinkConfig]] = {
    "jsonl": JsonlSinkConfig,
    "sqlite": SqliteSinkConfig,
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
    if kind in ("jsonl", "sqlite"):
        data_dir = Path(str(_setting(config, "data_dir") or "."))
        suffix = ".jsonl" if kind == "jsonl" else ".db"
        path = Path(str(data.get("path") or Path("sinks") / f"{data['name']}{suffix}"))
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
    if isinstance(model, SqliteSinkConfig):
        from crawlhub.sinks.sqlite import SqliteSink

        return SqliteSink(model, name=sink_name)
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
        from crawlhub.core.loading import check_call, import_object

        where = entry or f"sink '{name or kind}'"
        cls = import_object(kind, file=file, entry=where, key="type")
        check_call(cls, what=f"sink class {kind!r}", kwargs=[str(k) for k in spec if k != "type"],
                   methods=("open", "write_batch", "close"), file=file, entry=where, key="type")
        return
    sink_config(spec, config=config, name=name, file=file, entry=entry)


def _user_sink(path: str, spec: Mapping[str, Any], *, file: str | None, entry: str) -> Sink:
    from crawlhub.core.loading import import_object

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

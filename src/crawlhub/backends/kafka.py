"""librdkafka-style Kafka settings (``bootstrap.servers``, ``group.id``) as aiokafka kwargs.

taskHUB configs carry confluent-kafka settings; crawlhub runs on aiokafka, so the dotted
names are translated here, once, for the Kafka inbound and the Kafka sink.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from crawlhub.core.errors import ConfigError

#: librdkafka names whose aiokafka name is not the same words joined by '_'.
_ALIASES: dict[str, str] = {
    "fetch.wait.max.ms": "fetch_max_wait_ms",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "message.max.bytes": "max_request_size",
    "batch.size": "max_batch_size",
    "queue.buffering.max.ms": "linger_ms",
    "socket.timeout.ms": "request_timeout_ms",
    "reconnect.backoff.ms": "retry_backoff_ms",
    "topic.metadata.refresh.interval.ms": "metadata_max_age_ms",
}

#: Settings with no aiokafka counterpart that are safe to drop.
_IGNORED = frozenset({"auto.commit.interval.ms", "statistics.interval.ms", "log_level", "debug"})


def aiokafka_kwargs(
    settings: Mapping[str, Any],
    target: type,
    *,
    where: str,
    key: str = "consumer_settings",
) -> dict[str, Any]:
    """Translate ``settings`` for the constructor of ``target`` (an aiokafka class).

    A name may be librdkafka style (``session.timeout.ms``) or aiokafka style
    (``session_timeout_ms``). A name ``target`` does not take is a ``ConfigError`` that
    names it and ``where`` it was found.
    """
    params = inspect.signature(target).parameters
    accepted = set(params) - {"self", "loop", "topics"}
    out: dict[str, Any] = {}
    for name, value in settings.items():
        if name in _IGNORED:
            continue
        kwarg = _ALIASES.get(name, name.replace(".", "_"))
        if kwarg not in accepted:
            raise ConfigError(
                f"unknown Kafka setting {name!r} for {target.__name__}; use librdkafka names "
                f"such as bootstrap.servers, group.id, auto.offset.reset, session.timeout.ms",
                entry=where,
                key=f"{key}.{name}",
            )
        if kwarg == "bootstrap_servers" and isinstance(value, str):
            value = [s.strip() for s in value.split(",") if s.strip()]
        out[kwarg] = _coerce(value, params[kwarg].default, where=where, key=f"{key}.{name}")
    return out


def _coerce(value: Any, default: Any, *, where: str, key: str) -> Any:
    """librdkafka settings are often strings ("2000", "true"); aiokafka wants int/bool."""
    if not isinstance(value, str):
        return value
    if isinstance(default, bool):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"expected true or false, got {value!r}", entry=where, key=key)
    if isinstance(default, int):
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"expected a whole number, got {value!r}", entry=where, key=key) from None
    return value

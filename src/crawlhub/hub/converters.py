"""Converters: what an inbound does to a message before selectors see it.

A converter is called with the message dict and returns the converted dict (or None to
drop it). Built in, with taskHUB's names: ``RemoveBuildinKeys`` (keys logstash and
beats add), ``ExtractTaskParams`` and ``ExtractMetadata`` (lift a nested dict to the top
level so selectors and ``task_params`` can read its keys). Others load by import path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from crawlhub.core.errors import ConfigError
from crawlhub.core.loading import import_object

Converter = Callable[[dict[str, Any]], dict[str, Any] | None]

#: Keys logstash / filebeat add to every event.
LOGSTASH_KEYS = (
    "@timestamp", "@version", "@metadata", "host", "path", "tags", "log", "event", "agent",
    "ecs", "input", "fields", "beat", "offset", "prospector", "source", "message_id",
)


class RemoveBuildinKeys:
    """Drop the keys logstash/beats add (``keys`` to replace the list, ``extra`` to add)."""

    def __init__(self, keys: Iterable[str] | None = None, extra: Iterable[str] = ()) -> None:
        self.keys = tuple(keys if keys is not None else LOGSTASH_KEYS) + tuple(extra)

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        for key in self.keys:
            message.pop(key, None)
        return message


class _Lift:
    field = ""

    def __init__(self, keep: bool = False, overwrite: bool = True) -> None:
        self.keep = keep
        self.overwrite = overwrite

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        nested = message.get(self.field) if self.keep else message.pop(self.field, None)
        if isinstance(nested, dict):
            for key, value in nested.items():
                if self.overwrite or key not in message:
                    message[key] = value
        return message


class ExtractTaskParams(_Lift):
    """Lift ``task_params`` (what a spider logs of its task) to the top level."""

    field = "task_params"


class ExtractMetadata(_Lift):
    """Lift ``metadata`` to the top level."""

    field = "metadata"


BUILTIN_CONVERTERS: dict[str, type] = {
    "RemoveBuildinKeys": RemoveBuildinKeys,
    "ExtractTaskParams": ExtractTaskParams,
    "ExtractMetadata": ExtractMetadata,
}
#: taskHUB module names under which the built-ins were known.
_TASKHUB_MODULES = frozenset({"", "logstash", "common", "ic", "crawlhub"})


def build_converter(class_name: str, init: dict[str, Any], *, file: str | None = None,
                    entry: str | None = None, key: str = "convert") -> Converter:
    module, _, last = class_name.rpartition(".")
    if last in BUILTIN_CONVERTERS and module in _TASKHUB_MODULES:
        cls: Any = BUILTIN_CONVERTERS[last]
    else:
        cls = import_object(class_name, file=file, entry=entry, key=f"{key}.class")
    try:
        converter = cls(**init)
    except TypeError as exc:
        raise ConfigError(f"converter {class_name!r} rejected its init {init!r}: {exc}",
                          file=file, entry=entry, key=f"{key}.init") from exc
    if not callable(converter):
        raise ConfigError(f"converter {class_name!r} is not callable",
                          file=file, entry=entry, key=f"{key}.class")
    return converter  # type: ignore[no-any-return]

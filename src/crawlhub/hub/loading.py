"""Loading user classes named by import path in the config (``pkg.mod:Class`` or
``pkg.mod.Class``); an import failure is a config error naming the entry and key."""

from __future__ import annotations

import importlib
from typing import Any

from crawlhub.errors import ConfigError


def import_object(path: str, *, file: str | None = None, entry: str | None = None,
                  key: str | None = None) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(
            f"{path!r} is not an import path: write 'package.module:Class'",
            file=file, entry=entry, key=key,
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"cannot import module {module_name!r} for {path!r}: {exc}",
            file=file, entry=entry, key=key,
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(
            f"module {module_name!r} has no {attr!r} (from {path!r})",
            file=file, entry=entry, key=key,
        ) from None

"""User code the frontier config names by import path: key functions, segment resolvers.

``package.module:name`` (or ``package.module.name``); failures are ConfigErrors naming the key.
"""

from __future__ import annotations

import importlib
from typing import Any

from crawlhub.errors import ConfigError


def load_object(path: str, *, key: str) -> Any:
    """The object ``path`` names; ``key`` is the config key that named it (for errors)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{path!r} is not an import path: write 'package.module:name'", key=key)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} for {path!r}: {exc}", key=key) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no {attr!r} (from {path!r})", key=key) from None

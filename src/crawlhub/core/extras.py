"""Optional extras: import a client library that ships with an extra, or say how to get it.

``require("redis.asyncio", "redis")`` returns the module, or raises
:class:`~crawlhub.core.errors.MissingExtraError` whose one-line message names the command,
``pip install 'crawlhub[redis]'``; the CLI prints it as is, never a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from crawlhub.core.errors import MissingExtraError


def require(module: str, extra: str, *, needed_by: str | None = None) -> ModuleType:
    """``module`` imported, or a MissingExtraError naming ``extra`` (and ``needed_by``,
    e.g. ``"sink 'events'"``, when given)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(module, extra, needed_by=needed_by) from exc

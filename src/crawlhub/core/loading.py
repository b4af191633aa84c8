"""The one loader of user code a config names by import path (``pkg.mod:Class`` or
``pkg.mod.Class``), and the checks ``check-config`` runs on it without calling it.

A config names trusted code, as Scrapy settings do: importing a module runs its top level.
Constructors run only when a service is built (``serve``), never while checking.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from typing import Any

from crawlhub.core.errors import ConfigError


def import_object(path: str, *, file: str | None = None, entry: str | None = None,
                  key: str | None = None) -> Any:
    """The object ``path`` names; an import failure is a ConfigError at file/entry/key."""
    if not isinstance(path, str):
        raise ConfigError(f"expected an import path string, got {path!r}",
                          file=file, entry=entry, key=key)
    module_name, sep, attr = path.strip().partition(":")
    if not sep:
        module_name, _, attr = path.strip().rpartition(".")
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
        target: Any = module
        for part in attr.split("."):
            target = getattr(target, part)
    except AttributeError:
        raise ConfigError(
            f"module {module_name!r} has no {attr!r} (from {path!r})",
            file=file, entry=entry, key=key,
        ) from None
    return target


def check_call(
    target: Any,
    *,
    what: str,
    args: Iterable[str] = (),
    kwargs: Iterable[str] = (),
    methods: Iterable[str] = (),
    file: str | None = None,
    entry: str | None = None,
    key: str | None = None,
) -> None:
    """Check, without calling it, that ``target(*args, **kwargs)`` would be accepted.

    ``args``/``kwargs`` name the arguments the caller will pass (values are not needed);
    ``methods`` are attributes a class (or the instance it builds) must have. ``what``
    names the thing in messages, e.g. ``"outbound class 'my.mod:Out'"``.
    """
    if not callable(target):
        raise ConfigError(f"{what} is {target!r} ({type(target).__name__}), not a class or function",
                          file=file, entry=entry, key=key)
    # A factory function may build the instance: only a class can be checked for methods,
    # and only its own classes count (every class object has a metaclass __call__).
    missing = [
        m for m in methods
        if not any(callable(vars(k).get(m)) for k in inspect.getmro(target) if k is not object)
    ] if inspect.isclass(target) else []
    if missing:
        raise ConfigError(f"{what} has no {', '.join(m + '()' for m in missing)}: it is not"
                          " the kind of class this key takes", file=file, entry=entry, key=key)
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # a builtin without an introspectable signature: nothing more to check
    placeholder = object()
    try:
        signature.bind(*(placeholder for _ in args),
                       **{name: placeholder for name in kwargs})
    except TypeError as exc:
        passed = [*args, *(f"{name}=" for name in kwargs)]
        raise ConfigError(
            f"{what} cannot be called with ({', '.join(passed)}): {exc}; its signature is"
            f" {signature}", file=file, entry=entry, key=key,
        ) from None


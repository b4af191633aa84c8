"""A package's public face that imports its modules on first use, so importing one light
module of a package (its ``config``, say) does not import the whole package.

A package's ``__init__`` keeps its names for readers and type checkers under
``if TYPE_CHECKING:`` and hands the same names to :func:`lazy_face`; ``from pkg import
Name`` and ``pkg.Name`` work as before, the module holding ``Name`` imported then.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(package: str, names: Mapping[str, str]
              ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each public name to
    the module that defines it (``"crawlhub.agents.downloader"``). The first
    access imports that module and keeps the object in the package's namespace; any other
    name is an AttributeError (so ``from pkg import submodule`` still imports it)."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module protocol's name
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*namespace, *names})

    return __getattr__, __dir__

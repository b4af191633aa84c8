"""`{name}` placeholders in config string values, resolved from settings.

Selector strings are never touched: they are Python expressions with their own braces.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

#: ``{{`` and ``}}`` are literal braces; ``{name}`` is a placeholder.
PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: Mapping keys whose values are selector expressions: left exactly as written.
SELECTOR_KEYS = frozenset({"selector", "selectors"})

Lookup = Callable[[str], "str | None"]
Path = tuple[str | int, ...]


def substitute(text: str, lookup: Lookup, missing: list[str] | None = None) -> str:
    """Replace each ``{name}`` by ``lookup(name)``; unescape ``{{`` and ``}}``.

    A name the lookup does not know is appended to ``missing`` and left as written.
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return match.group(0)[0]
        value = lookup(name)
        if value is None:
            if missing is not None:
                missing.append(name)
            return match.group(0)
        return value

    return PLACEHOLDER_RE.sub(replace, text)


def substitute_tree(
    value: Any,
    lookup: Lookup,
    on_missing: Callable[[Path, str], None],
    path: Path = (),
) -> Any:
    """A copy of ``value`` with placeholders resolved in every string except selectors.

    Mapping keys stay as written; ``on_missing(path, name)`` is called for each unknown
    placeholder, ``path`` being the keys and list indexes leading to the string.
    """
    if isinstance(value, str):
        missing: list[str] = []
        result = substitute(value, lookup, missing)
        for name in missing:
            on_missing(path, name)
        return result
    if isinstance(value, Mapping):
        return {
            key: (
                item
                if isinstance(key, str) and key in SELECTOR_KEYS
                else substitute_tree(item, lookup, on_missing, (*path, key))
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [
            substitute_tree(item, lookup, on_missing, (*path, i)) for i, item in enumerate(value)
        ]
    return value

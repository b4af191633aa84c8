"""Keyset paging for the web page's tables: a page of rows and the cursors of the pages
before and after it, never an offset (an offset into 100,000 runs is a scan).

Query parameters, the same on every page: ``after=<key>`` shows the rows that follow the
row with that key in the table's order, ``before=<key>`` the rows that precede it;
``macros.html``'s ``pager`` links them. A page over SQL builds :class:`Page` itself
(``WHERE id < $1 ORDER BY id DESC LIMIT n + 1``, the extra row says whether there is a
next page); a page over a list already in memory uses :func:`keyset`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: Rows per page unless the page asks for another ``limit``.
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


@dataclass(slots=True)
class Page(Generic[T]):
    """``rows`` in display order; ``prev`` / ``next``: the cursor to put in ``before=`` /
    ``after=`` for the page before / after (None: there is none); ``total`` when known
    cheaply (an in-memory list), else None."""

    rows: list[T] = field(default_factory=list)
    prev: str | None = None
    next: str | None = None
    total: int | None = None
    #: 0-based position of the first row, when known (shown as "51-100 of 1,234")
    first: int | None = None


def limit_of(value: int | None) -> int:
    """A page size from the query, within 1..:data:`MAX_PAGE_SIZE`."""
    if value is None:
        return PAGE_SIZE
    return min(max(int(value), 1), MAX_PAGE_SIZE)


def keyset(items: Sequence[T], key: Callable[[T], Any], *, after: str | None = None,
           before: str | None = None, limit: int = PAGE_SIZE, descending: bool = False,
           parse: Callable[[str], Any] = str) -> Page[T]:
    """The page of ``items`` (sorted here by ``key``, ascending or ``descending``) that
    follows the cursor ``after`` or precedes ``before`` (the first page without either).
    ``parse`` turns a cursor back into a key (``int`` for numeric keys); a cursor that
    does not parse shows the first page. Costs a sort of ``items``: for lists of
    thousands, not for a table of runs."""
    ordered = sorted(items, key=key, reverse=descending)
    keys = [key(item) for item in ordered]

    def follows(k: Any, cursor: Any) -> bool:
        return bool(k < cursor) if descending else bool(k > cursor)

    n = len(ordered)
    start = 0
    try:
        if after is not None:
            cursor = parse(after)
            start = next((i for i, k in enumerate(keys) if follows(k, cursor)), n)
        elif before is not None:
            cursor = parse(before)
            end = next((i for i, k in enumerate(keys) if not follows(cursor, k)), n)
            start = max(end - limit, 0)
    except (ValueError, TypeError):
        start = 0
    rows = ordered[start:start + limit]
    if not rows and n and start >= n:  # past the end (rows went away): the last page
        start = max(n - limit, 0)
        rows = ordered[start:]
    return Page(rows=list(rows),
                prev=str(keys[start]) if start > 0 and rows else None,
                next=str(keys[start + len(rows) - 1]) if start + len(rows) < n else None,
                total=n, first=start)

"""Keyset paging for the web page's tables: a page of rows and the cursors of the pages
before and after it, never an offset (an offset into 100,000 runs is a scan).

Query parameters, the same on every page: ``after=<key>`` shows the rows that follow the
row with that key in the table's order, ``before=<key>`` the rows that precede it,
``limit=`` the rows a page shows (read with :func:`number_param` and :func:`text_param`,
which never fail); ``macros.html``'s ``pager`` links them. A list already in memory is
paged with :func:`keyset`; a table that SQL pages one way (``WHERE id < $1 ORDER BY id
DESC LIMIT n + 1``: the extra row says there is a next page) with :func:`forward`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fastapi import Request

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


def number_param(request: Request, name: str, default: int, *, low: int = 1,
                 high: int = MAX_PAGE_SIZE) -> int:
    """An integer query parameter (``limit``, a numeric cursor) within ``low..high``;
    ``default`` when absent or not a number (a page never fails on a hand-edited URL)."""
    text = request.query_params.get(name, "").strip()
    if not text.lstrip("-").isdigit():
        return default
    return min(max(int(text), low), high)


def text_param(request: Request, name: str, limit: int = 200) -> str | None:
    """A text query parameter (a filter, a cursor), stripped and cut to ``limit``
    characters; None when absent or blank."""
    text = request.query_params.get(name, "").strip()
    return text[:limit] or None


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


def forward(rows: Sequence[T], limit: int, key: Callable[[T], str], *,
            started: bool) -> Page[T]:
    """A page of a table that SQL pages one way only (``WHERE name > $1`` or ``id < $1``,
    ``LIMIT limit + 1``: the extra row says there is a next page). ``prev`` is ``""``
    when the page did not start at the beginning: ``control_macros.html``'s
    ``forward_pager`` links it to the first page instead of a page back."""
    shown = list(rows[:limit])
    more = len(rows) > limit and bool(shown)
    return Page(rows=shown, prev="" if started else None,
                next=key(shown[-1]) if more else None)

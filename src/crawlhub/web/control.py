"""What the control plane's pages (projects, jobs, runs, logs, alerts) share: the plane
itself, pages read forward from SQL, query numbers, and the answer for a thing not found.

Not a page (``routes.PAGES`` does not list it): the page modules import it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from fastapi import Request
from fastapi.responses import HTMLResponse

from crawlhub.errors import BackendUnavailable
from crawlhub.web.paging import MAX_PAGE_SIZE, Page
from crawlhub.web.render import page

if TYPE_CHECKING:
    from crawlhub.control.plane import ControlPlane
    from crawlhub.service import Services

T = TypeVar("T")


def plane(svc: Services) -> ControlPlane:
    """The control plane, or :class:`BackendUnavailable` (which ``render.attempt`` shows
    as a red line) on a server built without one."""
    if svc.control is None:
        raise BackendUnavailable("the control plane is not open on this server",
                                 backend="control")
    return svc.control


def number_param(request: Request, name: str, default: int, *, low: int = 1,
                 high: int = MAX_PAGE_SIZE) -> int:
    """An integer query parameter within ``low..high``; ``default`` when absent or not
    a number (a page never fails on a hand-edited URL)."""
    text = request.query_params.get(name, "").strip()
    if not text.lstrip("-").isdigit():
        return default
    return min(max(int(text), low), high)


def text_param(request: Request, name: str, limit: int = 200) -> str | None:
    """A text query parameter, stripped; None when absent or blank."""
    text = request.query_params.get(name, "").strip()
    return text[:limit] or None


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


def not_found(request: Request, *, area: str, title: str, message: str) -> HTMLResponse:
    """A page saying what is not there (404), with the nav to go elsewhere."""
    return page(request, "control_missing.html", area=area, title=title, status=404,
                message=message)

"""Rendering of the web page: the Jinja2 environment (autoescaped), its filters, the nav,
and the answers every page module gives - a whole page or a live fragment, routed in
pairs by :func:`live_page`.

Every HTML answer carries :data:`CSP`: scripts and styles come from ``/static/web/``
only, so a name that slipped past escaping still could not run.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from crawlhub import __version__
from crawlhub.api.deps import ServicesDep
from crawlhub.backends.errors import is_unavailable
from crawlhub.core.redact import redact_url

if TYPE_CHECKING:
    from jinja2 import Environment

    from crawlhub.services import Services

#: The web page's own static files (CSS, JS, vendored htmx), under the API's ``/static``.
STATIC = "/static/web"

#: No inline script or style, nothing from elsewhere; htmx runs with ``allowEval: false``
#: and without its injected indicator styles (``base.html``'s ``htmx-config`` meta).
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self';"
       " connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self';"
       " frame-ancestors 'none'")

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    # pages hold live data (and, behind a token, data not everyone may see)
    "Cache-Control": "no-store",
}


@dataclass(slots=True)
class Stat:
    """One figure of an overview card: ``12,345 left``; ``tone`` colours it (see
    :func:`tone`: good, busy, wait, bad, or '' for plain)."""

    label: str
    value: str
    tone: str = ""


@dataclass(slots=True)
class Card:
    """What an area shows on the overview: a title linking to its page, a few figures,
    and why it could not read them (a backend out of reach)."""

    title: str
    href: str
    stats: list[Stat] = field(default_factory=list)
    error: str | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Area:
    """One page of the web page: ``key`` (what ``page(..., area=key)`` names to light
    its nav link), the nav ``label``, its ``path``, and optionally ``summary``, the card
    it puts on the overview."""

    key: str
    label: str
    path: str
    summary: Callable[[Services], Awaitable[Card]] | None = None


_areas: list[Area] = []


def set_areas(areas: Sequence[Area]) -> None:
    """Called once by :mod:`crawlhub.web.routes` with the pages' areas, in the nav's order."""
    _areas[:] = areas


def areas() -> list[Area]:
    return list(_areas)


# ---------------------------------------------------------------------------- filters
def ago(ts: float | None, now: float | None = None) -> str:
    """``12 s ago``, ``5 min ago``, ``in 3 h`` (``-`` for no time)."""
    if ts is None or not math.isfinite(ts) or ts <= 0:
        return "-"
    delta = (time.time() if now is None else now) - ts
    text = duration(abs(delta), coarse=True)
    if abs(delta) < 1:
        return "just now"
    return f"{text} ago" if delta >= 0 else f"in {text}"


def duration(seconds: float | None, *, coarse: bool = False) -> str:
    """``850 ms``, ``42 s``, ``3 min 5 s``, ``2 h 10 min``, ``4 d 3 h`` (``-`` for None);
    ``coarse``: one unit only."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1 and not coarse:
        return f"{seconds * 1000:.0f} ms"
    s = int(seconds)
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "min", 60),
                                      ("min", 60, "s", 1)):
        if s >= size:
            whole, rest = divmod(s, size)
            if coarse or rest // subsize == 0:
                return f"{whole} {unit}"
            return f"{whole} {unit} {rest // subsize} {sub}"
    return f"{s} s"


def iso(ts: float | None) -> str:
    """UTC ISO 8601 (``2024-05-01T12:00:03Z``), for ``<time datetime>`` and tooltips."""
    if ts is None or not math.isfinite(ts) or ts <= 0:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clock(ts: float | None) -> str:
    """``12:00:03.250`` (UTC) for a log line."""
    if ts is None or not math.isfinite(ts):
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3]


def number(value: Any) -> str:
    """``12,345``; ``-`` for None (unknown, e.g. a queue out of reach)."""
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def per_second(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}/s" if value < 100 else f"{value:,.0f}/s"


def size(value: int | None) -> str:
    """``512 B``, ``3.2 MiB``."""
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"  # pragma: no cover - the loop returns


#: Status words -> the colour of their badge (``macros.html`` ``badge``).
TONES = {
    "good": ("alive", "ok", "success", "succeeded", "finished", "done", "passed", "enabled",
             "built", "available", "sent"),
    "busy": ("running", "active", "leased", "building", "started", "dispatched", "live"),
    "wait": ("paused", "pending", "queued", "scheduled", "waiting", "skipped", "ready",
             "disabled", "retried", "stopping", "cancelling"),
    "bad": ("dead", "failed", "error", "errored", "cancelled", "killed", "timeout",
            "unavailable", "critical", "lost"),
}
_TONE_OF = {word: tone for tone, words in TONES.items() for word in words}


def tone(status: Any) -> str:
    """``good``, ``busy``, ``wait``, ``bad`` or ``info`` for a status word."""
    return _TONE_OF.get(str(status).lower(), "info")


def span(start: float | None, end: float | None, t0: float, t1: float,
         now: float | None = None) -> tuple[float, float]:
    """Where a bar from ``start`` to ``end`` (None: still going, up to ``now``) sits on a
    timeline from ``t0`` to ``t1``: ``(left %, width %)``, at least 0.5 % wide so an
    instant task still shows."""
    if start is None:
        return 0.0, 0.0
    end = (time.time() if now is None else now) if end is None else end
    total = max(t1 - t0, 1e-9)
    left = min(max((start - t0) / total * 100, 0.0), 100.0)
    right = min(max((end - t0) / total * 100, left), 100.0)
    width = max(right - left, 0.5)
    left = min(left, 100.0 - width)
    return round(left, 3), round(width, 3)


def query(request: Request, **changes: Any) -> str:
    """The request's query string with ``changes`` (None removes a key): links that keep
    the filters a page was opened with."""
    params = dict(request.query_params)
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = str(value)
    from urllib.parse import urlencode

    text = urlencode(params)
    return f"?{text}" if text else ""


@functools.cache
def environment() -> Environment:
    """The page's Jinja2 environment (autoescaped, strict), made for the first page
    rendered: serving the API alone imports no Jinja2 (start-up). Templates compile on
    their first use, as before."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(loader=PackageLoader("crawlhub.web", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(ago=ago, duration=duration, iso=iso, clock=clock, number=number,
                       per_second=per_second, size=size, tone=tone)
    env.globals.update(STATIC=STATIC, version=__version__, span=span)
    return env



# ---------------------------------------------------------------------------- answers
def _context(request: Request, area: str, values: dict[str, Any]) -> dict[str, Any]:
    return {"request": request, "area": area, "nav": areas(), "now": time.time(),
            "auth": bool(request.app.state.token),
            "q": lambda **changes: query(request, **changes), **values}


def page(request: Request, template: str, *, area: str, title: str,
         status: int = 200, **values: Any) -> HTMLResponse:
    """A whole page: ``template`` extends ``base.html``; ``area`` lights its nav entry."""
    html = environment().get_template(template).render(
        _context(request, area, {"title": title, **values}))
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def fragment(request: Request, template: str, *, area: str = "", status: int = 200,
             **values: Any) -> HTMLResponse:
    """A live fragment (what an htmx poll swaps in): ``template`` renders one element,
    the same one the page includes."""
    html = environment().get_template(template).render(_context(request, area, values))
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def live_page(router: APIRouter, path: str, template: str, *, area: str, title: str,
              data: Callable[[Request, Services], Awaitable[dict[str, Any]]],
              live_path: str | None = None) -> None:
    """Route a page and the block it polls, both rendered from ``await data(request,
    svc)``: ``GET path`` answers ``{template}.html``, ``GET path/live`` (or
    ``live_path``) ``{template}_live.html``, the block that page includes."""

    async def whole(request: Request, svc: ServicesDep) -> HTMLResponse:
        return page(request, f"{template}.html", area=area, title=title,
                    **await data(request, svc))

    async def live(request: Request, svc: ServicesDep) -> HTMLResponse:
        return fragment(request, f"{template}_live.html", area=area,
                        **await data(request, svc))

    router.add_api_route(path, whole, methods=["GET"])
    router.add_api_route(live_path or f"{path}/live", live, methods=["GET"])


def not_found(request: Request, *, area: str, title: str, message: str) -> HTMLResponse:
    """A page saying what is not there (404), with the nav to go elsewhere."""
    return page(request, "missing.html", area=area, title=title, status=404,
                message=message)


T = TypeVar("T")


async def attempt(load: Awaitable[T], what: str) -> tuple[T | None, str | None]:
    """``(value, None)``, or ``(None, why)`` when a backend is out of reach: a page shows
    what it could read and says what it could not, instead of answering 503 whole."""
    try:
        return await load, None
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        return None, redact_url(f"{what} out of reach: {type(exc).__name__}: {exc}")

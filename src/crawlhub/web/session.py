"""The browser's session behind ``server.token``: a cookie instead of the bearer header a
browser cannot send on navigation, and the CSRF rule that comes with a cookie.

The cookie holds ``<expires>.<HMAC-SHA256(token, expires)>``, never the token: it cannot
be turned back into the token, it runs out after :data:`SESSION_SECONDS`, and changing
``server.token`` ends every session at once. It is HttpOnly and SameSite=Strict; on top
of that a request that changes something (POST, PUT, PATCH, DELETE) and is authenticated
by the cookie alone must carry ``HX-Request`` (htmx sends it) or ``X-Crawlhub-CSRF``:
headers a form on another site cannot send (only a CORS preflight could, which this
server never grants).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from urllib.parse import quote, urlsplit

from starlette.requests import cookie_parser
from starlette.types import Scope

COOKIE = "crawlhub_session"
#: How long a login lasts.
SESSION_SECONDS = 12 * 3600
LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
#: Headers that prove a request came from our own page's script.
CSRF_HEADERS = (b"hx-request", b"x-crawlhub-csrf")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _mac(token: bytes, expires: int) -> str:
    return hmac.new(token, f"crawlhub-web-session:{expires}".encode(), hashlib.sha256
                    ).hexdigest()


def issue(token: str, *, now: float | None = None) -> str:
    """A new cookie value for a browser that showed ``token``."""
    expires = int(time.time() if now is None else now) + SESSION_SECONDS
    return f"{expires}.{_mac(token.encode(), expires)}"


def valid(token: bytes, value: str, *, now: float | None = None) -> bool:
    """True if ``value`` was issued for ``token`` and has not run out (constant time)."""
    expires_text, _, mac = value.partition(".")
    if not expires_text.isdigit() or len(expires_text) > 12:
        return False
    expires = int(expires_text)
    if expires <= (time.time() if now is None else now):
        return False
    return hmac.compare_digest(mac.encode(), _mac(token, expires).encode())


def token_matches(token: str, given: str) -> bool:
    """The login form's check, in constant time."""
    return hmac.compare_digest(token.encode(), given.encode())


def _header(scope: Scope, name: bytes) -> bytes:
    return next((v for k, v in scope["headers"] if k == name), b"")


def cookie_of(scope: Scope) -> str:
    """The session cookie of a request ('' when it sent none)."""
    raw = _header(scope, b"cookie")
    return cookie_parser(raw.decode("latin-1")).get(COOKIE, "") if raw else ""


def csrf_ok(scope: Scope) -> bool:
    """A safe method, or an unsafe one that carries one of :data:`CSRF_HEADERS`."""
    return scope["method"] in SAFE_METHODS or any(
        _header(scope, name).strip() for name in CSRF_HEADERS)


def is_htmx(scope: Scope) -> bool:
    return bool(_header(scope, b"hx-request"))


def wants_page(scope: Scope) -> bool:
    """A browser navigating (GET/HEAD asking for HTML): it is sent to the login page."""
    return scope["method"] in ("GET", "HEAD") and b"text/html" in _header(scope, b"accept")


def login_url(scope: Scope) -> str:
    """``/login?next=<this path and query>``; for an htmx request, the page it came from
    (``HX-Current-URL``), not the fragment it asked for."""
    target = scope["path"]
    if scope.get("query_string"):
        target += "?" + scope["query_string"].decode("latin-1")
    current = _header(scope, b"hx-current-url").decode("latin-1")
    if current:
        parts = urlsplit(current)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{LOGIN_PATH}?next={quote(safe_next(target), safe='/')}"


def safe_next(value: str | None) -> str:
    """Where to go after the login: a path on this server, never another site."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")) \
            or any(c in value for c in "\r\n\\"):
        return "/"
    return value


class Sessions:
    """What :class:`crawlhub.app.asgi.BearerToken` asks of a request without a bearer
    token: is its cookie valid, may it change things, should it see the login page."""

    def __init__(self, token: str, clock: Callable[[], float] = time.time) -> None:
        self.token = token.encode()
        self.clock = clock

    def valid(self, scope: Scope) -> bool:
        value = cookie_of(scope)
        return bool(value) and valid(self.token, value, now=self.clock())

"""Who may talk to the API at all, before any token is looked at: a request must name this
server in ``Host`` (DNS rebinding), and one that changes something must not come from a
page of another origin (cross-site requests), nor carry a body a form could send.

A no-token server on 127.0.0.1 is reachable from every page its operator's browser opens;
these rules keep those pages out, with or without a token (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from crawlhub.core.hosts import LOOPBACK_NAMES, is_loopback

log = logging.getLogger("crawlhub.api")

#: Methods that change nothing: the Origin and content-type rules leave them alone.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Paths other sites post to on purpose, each checking its sender itself: the forges'
#: webhooks are signed (crawlhub.api.projects) and may be form-encoded (GitHub's
#: ``payload=``); the login form checks its own origin (crawlhub.web.login).
CROSS_SITE_PREFIXES = ("/hooks/",)
FORM_PATHS = frozenset({"/login"})
#: Headers only a script of our own page sends (a form on another site cannot).
CSRF_HEADERS = (b"hx-request", b"x-crawlhub-csrf")


def _header(scope: Scope, name: bytes) -> bytes:
    return next((v for k, v in scope["headers"] if k == name), b"")


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an origin's netloc, lower case, without the port:
    ``Example.com:8526`` -> ``example.com``, ``[::1]:80`` -> ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


def is_json_type(content_type: bytes | str) -> bool:
    """``application/json`` or any ``+json`` type: what a cross-site page cannot send
    without a CORS preflight (which this server never grants)."""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/")
                                          and kind.endswith("+json"))


class Hosts:
    """The ``Host`` names a server answers to: loopback names, the address a request came
    in on (the socket's own address: a wildcard bind answers on each of its interfaces'
    addresses), the configured ``bind`` and ``server.allowed_hosts``.

    A DNS-rebinding page reaches us under *its* name (``rebind.evil.example``), which is
    none of these."""

    def __init__(self, bind: str = "127.0.0.1", allowed: Iterable[str] = ()) -> None:
        names = {n.strip().lower() for n in allowed}
        self.any = "*" in names
        self.suffixes = tuple(n for n in names if n.startswith("."))
        #: the names listed one by one: a page there is ours (a proxy's public name)
        self.listed = {n.strip("[]") for n in names if not n.startswith(".") and n != "*"}
        self.names = self.listed | {n.strip("[]") for n in LOOPBACK_NAMES}
        bind = bind.strip().lower().strip("[]")
        if bind and bind not in ("0.0.0.0", "::"):
            self.names.add(bind)

    def allows(self, host: str, scope: Scope) -> bool:
        if self.any:
            return True
        name = host_name(host)
        if not name:
            return False
        if name in self.names or name.endswith(self.suffixes) or is_loopback(name):
            return True
        # the socket's own address (uvicorn: getsockname()); an in-process transport
        # puts the URL's host here, which is no network at all
        server = scope.get("server") or (None,)
        own = server[0]
        return isinstance(own, str) and name == own.strip("[]").lower() \
            and _is_address_or_name(name)


def _is_address_or_name(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return "." not in name or name.endswith((".test", ".localhost", ".invalid"))
    return True


class RequestGuard:
    """Pure ASGI middleware, outermost: refuses (JSON, before any body is read)

    - a ``Host`` not in :class:`Hosts` (421): DNS rebinding;
    - a request that changes something (POST, PUT, PATCH, DELETE) whose ``Origin`` is
      another origin, or which the browser marks ``Sec-Fetch-Site: cross-site`` or
      ``same-site`` (another port of this machine is the same *site*) (403);
    - such a request with a body that is not JSON (what a form or a no-cors fetch sends:
      form-encoded, multipart, text, or no type at all) without a header only our page's
      scripts send (415).

    Clients that are not browsers (the CLI, curl, scripts) send neither ``Origin`` nor
    ``Sec-Fetch-*`` and pass; they only must say ``Content-Type: application/json``.
    """

    def __init__(self, app: ASGIApp, hosts: Hosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self.problem(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        status, message = problem
        client = (scope.get("client") or ("?",))[0]
        log.warning("%s %s %s from %s: %s", self.refused, scope["method"], scope["path"][:200],
                    client, message)
        await self.refusal(status, message)(scope, receive, send)

    #: how the log line of a refusal starts
    refused = "refused"

    def refusal(self, status: int, message: str) -> JSONResponse:
        """The answer to a refused request (a face with its own error shape overrides it)."""
        return JSONResponse({"detail": message}, status_code=status)

    def problem(self, scope: Scope) -> tuple[int, str] | None:
        host = _header(scope, b"host").decode("latin-1")
        if not self.hosts.allows(host, scope):
            shown = host_name(host)[:100] or "(none)"
            return 421, (f"Host {shown!r} is not a name this server answers to (DNS-rebinding"
                         " guard): use its address, or add the name to server.allowed_hosts")
        if scope["method"] in SAFE_METHODS:
            return None
        path: str = scope["path"]
        if path.startswith(CROSS_SITE_PREFIXES):
            return None
        if not self.same_origin(scope, host, self.hosts.listed):
            return 403, (f"{scope['method']} from a page of another origin is refused"
                         " (cross-site request guard): use this server's own web page, or a"
                         " client that is not a browser")
        if path in FORM_PATHS or any(_header(scope, name).strip() for name in CSRF_HEADERS):
            return None
        kind = _header(scope, b"content-type")
        # an empty post (curl -X POST, urllib's data=b"" says it is a form) has nothing to
        # read: a browser's, from another site, was stopped by its Origin above
        if _has_body(scope) and not is_json_type(kind):
            shown = kind.decode("latin-1").partition(";")[0].strip()[:100] or "none"
            return 415, (f"a {scope['method']} body must be JSON: send 'Content-Type:"
                         f" application/json' (got {shown})")
        return None

    @staticmethod
    def same_origin(scope: Scope, host: str, listed: Iterable[str] = ()) -> bool:
        """No sign of another origin: ``Origin`` is this ``Host`` (or a name listed in
        ``server.allowed_hosts``: a proxy that passes ``Host: 127.0.0.1:8526`` on), and
        the browser does not call it cross-site or same-site."""
        fetch_site = _header(scope, b"sec-fetch-site").strip().lower()
        if fetch_site in (b"cross-site", b"same-site"):
            return False
        origin = _header(scope, b"origin").decode("latin-1").strip()
        if not origin:
            return True  # not a browser, or a same-origin request of an old one
        parts = urlsplit(origin)
        # "null" (a sandboxed frame, a file: page) and any other netloc are foreign
        if not parts.netloc:
            return False
        return parts.netloc.lower() == host.strip().lower() \
            or host_name(parts.netloc) in listed


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length").strip()
    if length:
        return length != b"0"
    return bool(_header(scope, b"transfer-encoding"))



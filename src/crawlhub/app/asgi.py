"""The FastAPI application: routers, the bearer token, JSON errors, body limits.

``create_app(config)`` opens the services on startup and closes them on shutdown;
``create_app(services=...)`` serves services someone else owns (tests, embedding).
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

# isort: off
import crawlhub.api  # first: it imports FastAPI with its OpenAPI models unbuilt
# isort: on
from fastapi import FastAPI
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from crawlhub import __version__

# The routers and the services they import define ~100 pydantic models: those no start-up
# uses are built on their first use instead (~30 ms of serve's start-up, bench/startup.py).
with crawlhub.api.deferred_builds():
    from crawlhub.api import (
        agents,
        alerts,
        center,
        docs,
        errors,
        frontier,
        health,
        inbounds,
        jobs,
        logs,
        openapi,
        outbounds,
        projects,
        queues,
        runs,
        tasks,
    )
    from crawlhub.api.body import BodyGuard
    from crawlhub.api.guard import Hosts, RequestGuard
    from crawlhub.api.throttle import Throttle, client_of
    from crawlhub.backends.errors import clients_of
    from crawlhub.services import Services
    from crawlhub.web import session

log = logging.getLogger("crawlhub.api")

#: Paths anyone may read even when ``server.token`` is set.
PUBLIC_PATHS = frozenset({"/healthz", docs.DOCS_URL, "/openapi.json", docs.REDOC_URL,
                          docs.OAUTH2_REDIRECT_URL, session.LOGIN_PATH})
#: Path prefixes anyone may read: the package's static files (docs assets), and the
#: forges' webhooks (signed by the forge instead: crawlhub.api.projects).
PUBLIC_PREFIXES = (f"{docs.STATIC_URL}/", "/hooks/")
#: The API's routers, in the order the app mounts them (the web page's come after).
#: health first: a liveness probe's first request compiles only its own routes.
ROUTERS = (health, tasks, inbounds, outbounds, queues, agents, frontier, jobs, center, runs,
           projects, logs, alerts)


class BearerToken:
    """Pure ASGI middleware: every path but :data:`PUBLIC_PATHS` needs the bearer token
    (no per-request Request object or task, unlike ``@app.middleware``), or the web
    page's session cookie (:mod:`crawlhub.web.session`, with its CSRF rule); a browser
    with neither is sent to the login page. Wrong tokens are counted per client
    (:class:`crawlhub.api.throttle.Throttle`): past a few, tries wait (429)."""

    def __init__(self, app: ASGIApp, token: str, throttle: Throttle | None = None) -> None:
        self.app = app
        self.token = token.encode()
        self.sessions = session.Sessions(token)
        self.throttle = throttle if throttle is not None else Throttle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # lifespan scopes have no path: check the type first, or serve never starts
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS \
                or scope["path"].startswith(PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        response: Response
        if scheme.lower() == b"bearer":
            client = client_of(scope)
            wait = self.throttle.wait(client)
            if wait > 0:  # not even compared: a guesser learns nothing while it waits
                response = JSONResponse(
                    {"detail": f"too many wrong tokens from {client}: try again in"
                     f" {errors.retry_after_header(wait)} s"}, status_code=429,
                    headers={"Retry-After": errors.retry_after_header(wait)})
                await response(scope, receive, send)
                return
            if secrets.compare_digest(given.strip(), self.token):
                await self.app(scope, receive, send)
                return
            self.throttle.failed(client, "bearer token")
        if self.sessions.valid(scope):
            if session.csrf_ok(scope):
                await self.app(scope, receive, send)
                return
            response = JSONResponse(
                {"detail": f"{scope['method']} with the session cookie alone needs the"
                 " header HX-Request or X-Crawlhub-CSRF (CSRF protection)"}, status_code=403)
        elif session.wants_page(scope):
            response = RedirectResponse(session.login_url(scope), status_code=303)
        else:
            # htmx follows HX-Redirect: a page whose session ran out goes to the login
            extra = {"HX-Redirect": session.login_url(scope)} if session.is_htmx(scope) else {}
            response = JSONResponse(
                {"detail": "missing or wrong bearer token: send 'Authorization: Bearer"
                 " <server.token>'"}, status_code=401,
                headers={"WWW-Authenticate": "Bearer", **extra})
        await response(scope, receive, send)


def create_app(config: Any | None = None, *, services: Services | None = None) -> FastAPI:
    if config is None and services is None:
        raise ValueError("create_app needs a config or services")
    cfg: Any = services.config if services is not None else config

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if services is not None:
            app.state.services = services
            yield
            return
        svc = await Services.open(cfg)
        app.state.services = svc
        await svc.start()
        try:
            yield
        finally:
            await svc.close()

    app = FastAPI(title="crawlhub", version=__version__, lifespan=lifespan,
                  description="Task intake, rule routing, reliable queues, frontier,"
                  " collection jobs.", docs_url=None, redoc_url=None)
    if services is not None:
        app.state.services = services
    token = cfg.server.token.get_secret_value() if cfg.server.token else None
    app.state.token = token
    #: wrong tokens per client, of the bearer header and the login form alike
    app.state.throttle = Throttle()
    #: open log tails, per client and in total (crawlhub.api.logs)
    app.state.tails = logs.Tails(per_client=cfg.server.max_tails_per_client,
                                 total=cfg.server.max_tails)

    # Added last = runs first: a client without the token never gets to send a body,
    # and a foreign page or Host is refused before the token is looked at.
    app.add_middleware(BodyGuard, timeout=float(cfg.server.body_timeout),
                       max_bytes=int(cfg.server.max_body_bytes))
    if token:
        app.add_middleware(BearerToken, token=token, throttle=app.state.throttle)
    app.state.hosts = Hosts(cfg.server.bind, cfg.server.allowed_hosts)
    app.add_middleware(RequestGuard, hosts=app.state.hosts)

    errors.install(app, clients_of(cfg))
    docs.install(app)
    # With a token, every route but the public ones can also answer 401.
    openapi.install(app, token_paths=(lambda path: path not in PUBLIC_PATHS) if token else None)

    # (imported here, not above: the web pages import crawlhub.api's deps and models)
    from crawlhub.web import routes as web_routes

    for module in ROUTERS:
        app.include_router(module.router)
    for router in web_routes.ROUTERS:
        app.include_router(router, include_in_schema=False)
    return app


def create_scrapyd_app(app: FastAPI, cfg: Any) -> ASGIApp:
    """Scrapyd's API (:mod:`crawlhub.api.scrapyd`) over the services ``app`` serves, with
    its token, its throttle of wrong tokens and its ``Host`` rules (``scrapyd.bind``
    beside ``server.allowed_hosts``); ``crawlhub serve`` serves it on ``scrapyd.port``."""
    from crawlhub.api import scrapyd

    def service() -> Any:
        services = getattr(app.state, "services", None)
        control = getattr(services, "control", None)
        return getattr(control, "scrapyd", None)

    section = cfg.scrapyd
    return scrapyd.create_app(
        service, node_name=section.node_name or socket.gethostname(), token=app.state.token,
        hosts=Hosts(section.bind, cfg.server.allowed_hosts), throttle=app.state.throttle,
        max_body=int(section.max_egg_bytes), body_timeout=float(cfg.server.body_timeout))

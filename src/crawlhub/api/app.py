"""The FastAPI application: routers, the bearer token, JSON errors, body limits.

``create_app(config)`` opens the services on startup and closes them on shutdown;
``create_app(services=...)`` serves services someone else owns (tests, embedding).
"""

from __future__ import annotations

import importlib
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from crawlhub import __version__
from crawlhub.api import health, inbounds, outbounds, queues, tasks
from crawlhub.api.deps import ApiError
from crawlhub.service import Services

log = logging.getLogger("crawlhub.api")

#: Paths anyone may read even when ``server.token`` is set.
PUBLIC_PATHS = frozenset({"/healthz", "/docs", "/openapi.json", "/redoc",
                          "/docs/oauth2-redirect"})
#: Routers of other parts, mounted when their module is present.
OPTIONAL_ROUTERS = ("crawlhub.api.frontier", "crawlhub.api.jobs")


class BearerToken:
    """Pure ASGI middleware: every path but :data:`PUBLIC_PATHS` needs the bearer token
    (no per-request Request object or task, unlike ``@app.middleware``)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        if scheme.lower() == b"bearer" and secrets.compare_digest(given.strip(), self.token):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"detail": "missing or wrong bearer token: send 'Authorization: Bearer"
             " <server.token>'"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
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
                  " collection jobs.")
    if services is not None:
        app.state.services = services
    app.state.max_body_bytes = int(cfg.server.max_body_bytes)
    token = cfg.server.token.get_secret_value() if cfg.server.token else None
    app.state.token = token

    if token:
        app.add_middleware(BearerToken, token=token)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {}
        if "retry_after" in exc.extra:
            headers["Retry-After"] = str(max(1, round(float(exc.extra["retry_after"]))))
        return JSONResponse({"detail": exc.detail, **exc.extra}, status_code=exc.status_code,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"where": ".".join(str(p) for p in err.get("loc", ())), "problem": err.get("msg"),
             "type": err.get("type")}
            for err in exc.errors()
        ]
        first = problems[0] if problems else {"where": "body", "problem": "invalid"}
        return JSONResponse(
            {"detail": f"invalid request: {first['where']}: {first['problem']}",
             "errors": problems}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        return JSONResponse({"detail": detail}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}; see the"
                             " server log"}, status_code=500)

    for module in (tasks, inbounds, outbounds, queues, health):
        app.include_router(module.router)
    for name in OPTIONAL_ROUTERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        app.include_router(module.router)
    return app

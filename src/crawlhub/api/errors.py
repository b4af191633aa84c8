"""Every error the API answers, as JSON: 4xx that say why, 503 + Retry-After for a backend
outage, 500 for a bug. Handlers answer without re-raising, so the connection stays usable.

The one mapping of crawlhub's errors to statuses (routers raise, they do not translate):

    NotFoundError        404   an unknown inbound, outbound prefix, frontier, job, ...
    ConflictError        409   refused in the current state
    ConvertError         422   an inbound's converter failed on the message
    QueueNameError       400   a queue name no backend takes
    BackpressureError    503   an outbound over its max_lag (``retry_after`` in the body)
    BackendUnavailable   503   a backend out of reach (and any error an outage causes)

Starlette re-raises whatever reaches its catch-all ``Exception`` handler after answering,
and uvicorn then closes the keep-alive connection; so backend errors (crawlhub's own and
the raw Redis / PostgreSQL / SQLite / socket ones) get handlers for their own types.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from crawlhub.api.deps import ApiError
from crawlhub.backends.errors import is_unavailable, unavailable, unavailable_types
from crawlhub.core.errors import (
    BackendUnavailable,
    BackpressureError,
    ConflictError,
    ConvertError,
    CrawlhubError,
    NotFoundError,
)
from crawlhub.core.redact import redact_text, redact_url
from crawlhub.queues.common import QueueNameError

log = logging.getLogger("crawlhub.api")

#: Root modules of client libraries -> the backend name a 503 reports when the error
#: itself carries none.
_BACKEND_OF_MODULE = {"redis": "redis", "valkey": "redis", "asyncpg": "postgresql",
                      "psycopg": "postgresql", "sqlite3": "sqlite", "_sqlite3": "sqlite"}
#: crawlhub's errors that are the client's to fix, by status; the body is the message.
CLIENT_ERRORS: dict[type[Exception], int] = {NotFoundError: 404, ConflictError: 409,
                                             ConvertError: 422, QueueNameError: 400}


def install(app: FastAPI, clients: Iterable[str] | None = None) -> None:
    """Register the JSON error answers on ``app``; ``clients``: the backend client
    libraries whose outages get a 503 without a traceback (``backends.errors.clients_of``
    the config; ``None``: every one installed)."""
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    for client_error in CLIENT_ERRORS:
        app.add_exception_handler(client_error, _client_error)
    app.add_exception_handler(BackpressureError, _backpressure)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    for error_type in (BackendUnavailable, CrawlhubError, OSError, *unavailable_types(clients)):
        app.add_exception_handler(error_type, backend_error)
    app.add_exception_handler(Exception, _crash)


def masked(body: Any) -> Any:
    """An error body with the secrets of every text in it masked (URL passwords, secret
    query values, ``'password': '...'`` pairs): a 4xx may quote what the client sent -
    a URL, a value, a path."""
    if isinstance(body, str):
        return redact_text(body)
    if isinstance(body, dict):
        return {k: masked(v) for k, v in body.items()}
    if isinstance(body, list | tuple):
        return [masked(v) for v in body]
    return body


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` in whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


async def backend_error(request: Request, exc: Exception) -> JSONResponse:
    """503 + ``Retry-After`` when ``exc`` says a backend is out of reach, else a 500.

    The body is ``{"detail": ..., "backend": ...}`` with URL passwords masked.
    """
    if not is_unavailable(exc):
        return internal_error(request, exc)
    name = _backend_of(exc)
    down = unavailable(exc, name)
    backend = redact_url(down.backend or name)
    detail = redact_url(str(down))
    log.warning("%s %s: %s", request.method, request.url.path, detail)
    return JSONResponse({"detail": detail, "backend": backend}, status_code=503,
                        headers={"Retry-After": retry_after_header(down.retry_after)})


def _backend_of(exc: BaseException) -> str:
    """A short backend name from the client library that raised ``exc`` (or its cause)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, BackendUnavailable) and error.backend:
            return error.backend
        root = type(error).__module__.partition(".")[0]
        if root in _BACKEND_OF_MODULE:
            return _BACKEND_OF_MODULE[root]
        error = error.__cause__ or error.__context__
    return ""


def internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"detail": f"internal error: {type(exc).__name__}; see the server"
                         " log"}, status_code=500)


async def _crash(request: Request, exc: Exception) -> JSONResponse:
    # Last resort: Starlette answers with this, then re-raises (uvicorn closes the
    # connection). Backend outages never get here: backend_error answers them above.
    if is_unavailable(exc):
        return await backend_error(request, exc)
    return internal_error(request, exc)


async def _client_error(request: Request, exc: Exception) -> JSONResponse:
    status = next(CLIENT_ERRORS[t] for t in type(exc).__mro__ if t in CLIENT_ERRORS)
    return JSONResponse(masked({"detail": str(exc)}), status_code=status)


async def _backpressure(request: Request, exc: BackpressureError) -> JSONResponse:
    return JSONResponse({"detail": str(exc), "retry_after": exc.retry_after}, status_code=503,
                        headers={"Retry-After": retry_after_header(exc.retry_after)})


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    headers = dict(exc.headers or {})
    if "retry_after" in exc.extra:
        headers["Retry-After"] = retry_after_header(float(exc.extra["retry_after"]))
    return JSONResponse(masked({"detail": exc.detail, **exc.extra}),
                        status_code=exc.status_code, headers=headers or None)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = [
        {"where": ".".join(str(p) for p in err.get("loc", ())), "problem": err.get("msg"),
         "type": err.get("type")}
        for err in exc.errors()
    ]
    first = problems[0] if problems else {"where": "body", "problem": "invalid"}
    return JSONResponse(masked(
        {"detail": f"invalid request: {first['where']}: {first['problem']}",
         "errors": problems}), status_code=422)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no such endpoint: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    return JSONResponse(masked({"detail": detail}), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))

"""Shared pieces of the API routers: the services, JSON bodies read strictly, errors.

A router takes the running product as one typed dependency and reaches nothing else::

    @router.get("/thing/")
    async def things(svc: ServicesDep) -> ...:   # or svc: Services = Depends(services)
        return await svc.hub...

and raises :mod:`crawlhub.core.errors` (``NotFoundError``, ``ConflictError``, ...), which the
app maps to HTTP statuses once (:mod:`crawlhub.api.errors`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

import orjson
from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse

from crawlhub.api.guard import is_json_type
from crawlhub.control.plane import ControlPlane
from crawlhub.core import jsoncodec
from crawlhub.core.errors import BackendUnavailable
from crawlhub.services import Services


async def services(request: Request) -> Services:
    """The :class:`Services` the app serves (``create_app`` puts them on the app)."""
    svc: Services = request.app.state.services
    return svc


#: The one dependency of every router: ``svc: ServicesDep``.
ServicesDep = Annotated[Services, Depends(services)]


def control_plane(svc: Services) -> ControlPlane:
    """The control plane of ``svc`` (its parts typed: ``control_plane(svc).jobs``), or
    :class:`BackendUnavailable` (503) on a server built without one."""
    if svc.control is None:
        raise BackendUnavailable("the control plane is not open on this server",
                                 backend="control")
    return svc.control


class FastJSONResponse(JSONResponse):
    """A :class:`JSONResponse` rendered by orjson: the same bytes as Starlette's
    (compact, UTF-8 unescaped, no NaN), at a fraction of the cost for a long answer
    (``POST /task/``'s list). What orjson will not write (an integer beyond 64 bits,
    a lone surrogate) is rendered by Starlette's own way, which answers it as before."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except orjson.JSONEncodeError:
            return super().render(content)


class ApiError(HTTPException):
    """A 4xx answer with a JSON body ``{"detail": message, ...extra}``."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(status_code=status, detail=message)
        self.extra = extra


async def json_body(request: Request) -> Any:
    """The request body as JSON, or a 400 that says what is wrong (size, time and UTF-8
    are checked as it arrives: :class:`crawlhub.api.body.BodyGuard`). It must say
    ``Content-Type: application/json`` (415 otherwise): a page of another site can post
    a form or ``text/plain`` without asking, never JSON."""
    kind = request.headers.get("content-type", "")
    if not is_json_type(kind):
        shown = kind.partition(";")[0].strip()[:100] or "none"
        raise ApiError(415, f"request body must be JSON: send 'Content-Type: application/json'"
                       f" (got {shown})")
    chunks = [chunk async for chunk in request.stream()]
    body = b"".join(chunks)
    if not body.strip():
        raise ApiError(400, "request body is empty; send a JSON object or a list of objects")
    value = _fast_loads(body)
    if value is _SLOW:
        value = _loads(body)
    # A "\ud800" escape with no partner decodes to text no store can encode.
    if _SURROGATE_ESCAPE.search(body):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, "request body holds a lone UTF-16 surrogate escape (such as"
                           " \\ud800); send well-formed text") from None
    return value


#: What :func:`_fast_loads` answers for a body it leaves to the standard library.
_SLOW: Any = object()


def _fast_loads(body: bytes) -> Any:
    """The body parsed by orjson when that gives what the standard library's parse
    (:func:`_loads`) gives, else :data:`_SLOW`. orjson refuses what that parse refuses
    (NaN, Infinity, numbers that overflow to infinity, lone surrogates, control
    characters, a BOM, trailing commas...), so any error goes to the slow path, which
    answers it as before; but it reads an integer beyond 64 bits as a float, so a body
    with a run of 19 digits anywhere (a cheap over-approximation) goes there too."""
    if jsoncodec.long_digits(body):
        return _SLOW
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return _SLOW


def _loads(body: bytes) -> Any:
    """The body parsed strictly by the standard library, or the 400 that says why not."""
    try:
        # Strict UTF-8: json.loads(bytes) would let UTF-8-encoded surrogates through.
        value = json.loads(body.decode("utf-8-sig"), parse_constant=_no_constant,
                           parse_float=_finite_float)
    except UnicodeDecodeError:
        raise ApiError(400, "request body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc.msg} at line {exc.lineno}"
                       f" column {exc.colno}") from None
    except RecursionError:
        raise ApiError(400, str(jsoncodec.TooDeepError("request body")),
                       max_depth=jsoncodec.MAX_DEPTH) from None
    except ValueError as exc:  # NaN, Infinity, 1e400, an integer of over 4300 digits
        raise ApiError(400, f"request body holds a number JSON cannot carry: {exc}") from None
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"{text} is out of range")
    return number


def objects(body: Any, *, what: str = "task", limit: int | None = None) -> tuple[list[dict[str, Any]], bool]:
    """``body`` as a list of JSON objects, and whether it was a list; 422 otherwise."""
    many = isinstance(body, list)
    items = body if many else [body]
    if many and not items:
        raise ApiError(422, f"the list is empty; send at least one {what}")
    if limit is not None and len(items) > limit:
        raise ApiError(413, f"{len(items)} {what}s in one request is over the limit of {limit}"
                       " (server.max_tasks_per_request)")
    bad = [i for i, item in enumerate(items) if not isinstance(item, dict)]
    if bad:
        where = f"item {bad[0]}" if many else "the body"
        got = type(items[bad[0]]).__name__
        raise ApiError(422, f"{where} is a JSON {_json_kind(got)}; each {what} must be a JSON"
                       " object like {\"url\": \"...\"}", invalid_items=bad[:20])
    for i, item in enumerate(items):
        # What the hub accepts it must hand out again (leases, dry runs): one limit.
        if jsoncodec.too_deep(item, jsoncodec.MAX_DEPTH):
            where = f"item {i}" if many else "the body"
            raise ApiError(400, str(jsoncodec.TooDeepError(where)),
                           max_depth=jsoncodec.MAX_DEPTH)
    return items, many


def _json_kind(pytype: str) -> str:
    return {"str": "string", "int": "number", "float": "number", "list": "array",
            "NoneType": "null", "bool": "boolean"}.get(pytype, pytype)

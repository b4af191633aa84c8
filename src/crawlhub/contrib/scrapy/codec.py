"""Scrapy requests as JSON: what the frontier stores for a scheduled request.

``Request.to_dict`` names callbacks by their spider method and keeps meta, headers,
cookies, body, priority, flags and cb_kwargs; this module turns that dict into JSON and
back. JSON has no bytes, tuples or non-text keys, so those travel tagged (``{"\\u0000b":
base64}``, ``{"\\u0000t": [...]}``, ``{"\\u0000d": [[key, value], ...]}``). Nothing is
pickled: a stored request is data, never code, whoever wrote it. A value JSON cannot
hold (an object in meta) makes :class:`Unserializable`; the scheduler then keeps that
request in memory, as Scrapy's disk queues do.
"""

from __future__ import annotations

import base64
import json
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request, Spider

_BYTES, _TUPLE, _DICT = "\x00b", "\x00t", "\x00d"
#: Nesting deeper than this is refused (a cycle, or meta nobody should ship).
MAX_DEPTH = 64


class Unserializable(ValueError):
    """A request holds a value JSON cannot carry (named in the message)."""


def _enc(value: Any, depth: int) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if depth > MAX_DEPTH:
        raise Unserializable(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, bytes):
        return {_BYTES: base64.b64encode(value).decode("ascii")}
    if isinstance(value, list):
        return [_enc(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {_TUPLE: [_enc(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        if all(type(k) is str and not k.startswith("\x00") for k in value):
            return {k: _enc(v, depth + 1) for k, v in value.items()}
        return {_DICT: [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in value.items()]}
    raise Unserializable(f"a {type(value).__module__}.{type(value).__qualname__} value")


def _dec(value: Any) -> Any:
    if isinstance(value, list):
        return [_dec(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag == _BYTES:
                return base64.b64decode(inner)
            if tag == _TUPLE:
                return tuple(_dec(v) for v in inner)
            if tag == _DICT:
                return {_hashable(_dec(k)): _dec(v) for k, v in inner}
        return {k: _dec(v) for k, v in value.items()}
    return value


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def dumps(data: Any) -> str:
    """Tagged JSON of ``data`` (raises :class:`Unserializable`)."""
    return json.dumps(_enc(data, 0), separators=(",", ":"), ensure_ascii=False,
                      allow_nan=True)


def loads(text: str | bytes) -> Any:
    return _dec(json.loads(text))


#: Per spider, the name ``Request.to_dict`` gave each method it named (see _as_dict).
_names: weakref.WeakKeyDictionary[Any, dict[Any, str]] = weakref.WeakKeyDictionary()


def _method_name(spider: Spider, func: Any) -> Any:
    """``to_dict``'s name of callback ``func``: Scrapy finds it by listing every member
    of the spider (``inspect.getmembers``), the largest cost of an enqueue; the answer is
    remembered per spider and function."""
    if not callable(func):
        return func
    names = _names.get(spider)
    if names is None:
        names = _names[spider] = {}
    ident = getattr(func, "__func__", func)
    name = names.get(ident)
    if name is None:
        from scrapy.http.request import _find_method

        name = names[ident] = _find_method(spider, func)
    return name


def _as_dict(request: Request, spider: Spider | None) -> dict[str, Any]:
    """``request.to_dict(spider=spider)``, its callbacks' names remembered (the same
    dict: url, callback, errback, headers, then every attribute, then the class)."""
    if spider is None:
        return request.to_dict(spider=spider)
    from scrapy import Request

    data: dict[str, Any] = {
        "url": request.url,
        "callback": _method_name(spider, request.callback),
        "errback": _method_name(spider, request.errback),
        "headers": dict(request.headers),
    }
    for attr in request.attributes:
        data.setdefault(attr, getattr(request, attr))
    if type(request) is not Request:
        data["_class"] = request.__module__ + "." + type(request).__name__
    return data


def request_to_data(request: Request, spider: Spider) -> dict[str, Any]:
    """The JSON-ready form of ``request`` (callbacks by name). Raises
    :class:`Unserializable` naming what cannot travel: a callback that is not a method
    of the spider, or a meta value JSON cannot hold."""
    try:
        data = _as_dict(request, spider)
    except ValueError as exc:  # a callback that is not a spider method
        raise Unserializable(str(exc)) from None
    try:
        return {k: _enc(v, 0) for k, v in data.items()}
    except Unserializable as exc:
        raise Unserializable(f"request {request.url} holds {exc}") from None


def request_from_data(data: dict[str, Any], spider: Spider) -> Request:
    """The request ``request_to_data`` described, callbacks looked up on ``spider``."""
    from scrapy.utils.request import request_from_dict

    return request_from_dict({k: _dec(v) for k, v in data.items()}, spider=spider)

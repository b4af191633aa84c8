"""Routers whose routes are analysed once, where they are served, not also where defined.

FastAPI (as of 0.165) serves a router's routes through the app that includes it:
``include_router`` keeps the router, and on the first request that reaches it FastAPI
builds each route again in that context (``_EffectiveRouteContext``: its dependencies,
body and response fields, its handler). The :class:`fastapi.routing.APIRoute` that
``@router.get`` made at import had done the same analysis already, and is never the one
that serves: every route of crawlhub is in an included router. That first analysis was
~1 ms per route, 40-50 ms of ``crawlhub serve``'s start-up (``bench/startup.py``) for
nothing.

:class:`DeferredRoute` keeps what the include reads (path, name, methods, the arguments
as given; not even the path's regex) and does the rest only if something asks for it: any other attribute builds
the whole route as :class:`~fastapi.routing.APIRoute` would have, so a caller that uses
the route itself (a test on the bare router, a FastAPI that still copies routes) gets
the same route, built late (a route FastAPI would refuse is then refused on that use:
``tests/api/test_routing.py`` builds every one). With a FastAPI without included-router
contexts, routes are built at once, as before.
"""

from __future__ import annotations

import inspect
from enum import IntEnum
from typing import Any

from fastapi import APIRouter
from fastapi import routing as fastapi_routing

#: FastAPI builds included routes again per include (the case this module is for).
_REBUILDS_INCLUDED = hasattr(fastapi_routing, "_EffectiveRouteContext")

#: How APIRoute checks its form_limits argument (as given where FastAPI has none).
_FORM_LIMITS: Any = getattr(fastapi_routing, "_validate_form_limits", lambda limits: limits)

#: The arguments the include reads from the route, with APIRoute's defaults.
_AS_GIVEN: tuple[tuple[str, Any], ...] = (
    ("summary", None), ("response_description", "Successful Response"),
    ("deprecated", None), ("operation_id", None), ("response_model_include", None),
    ("response_model_exclude", None), ("response_model_by_alias", True),
    ("response_model_exclude_unset", False), ("response_model_exclude_defaults", False),
    ("response_model_exclude_none", False), ("include_in_schema", True),
    ("dependency_overrides_provider", None), ("callbacks", None), ("openapi_extra", None),
    ("max_body_size", None), ("stream_item_type", None),
)


class DeferredRoute(fastapi_routing.APIRoute):
    """An :class:`~fastapi.routing.APIRoute` built on first use of what the include does
    not read (module docstring)."""

    def __init__(self, path: str, endpoint: Any, **kwargs: Any) -> None:
        if not _REBUILDS_INCLUDED:
            super().__init__(path, endpoint, **kwargs)
            return
        self.__dict__["_deferred"] = (path, endpoint, kwargs)
        # What _populate_api_route_state sets without analysing anything, as it sets it;
        # response_model stays as given (a default is inferred again by the include).
        self.path = path
        self.endpoint = endpoint
        self.response_model = kwargs.get("response_model", fastapi_routing.Default(None))
        for key, default in _AS_GIVEN:
            setattr(self, key, kwargs.get(key, default))
        self.response_class = kwargs.get("response_class",
                                         fastapi_routing.Default(fastapi_routing.JSONResponse))
        self.generate_unique_id_function = kwargs.get(
            "generate_unique_id_function", fastapi_routing.Default(fastapi_routing.generate_unique_id))
        self.strict_content_type = kwargs.get("strict_content_type",
                                              fastapi_routing.Default(True))
        self.tags = kwargs.get("tags") or []
        self.responses = kwargs.get("responses") or {}
        name: str | None = kwargs.get("name")
        self.name = fastapi_routing.get_name(endpoint) if name is None else name
        self.methods = {method.upper() for method in kwargs.get("methods") or ["GET"]}
        status_code = kwargs.get("status_code")
        self.status_code = int(status_code) if isinstance(status_code, IntEnum) else status_code
        self.dependencies = list(kwargs.get("dependencies") or [])
        # read from the route itself when the include builds its handler
        self.form_limits = _FORM_LIMITS(kwargs.get("form_limits"))
        description = kwargs.get("description") or inspect.cleandoc(endpoint.__doc__ or "")
        self.description = description.split("\f")[0].strip()

    def __getattr__(self, name: str) -> Any:
        # only for attributes not set above: build the route, then answer (popped first:
        # what the build itself reads must not start another build)
        deferred = None if name.startswith("__") else self.__dict__.pop("_deferred", None)
        if deferred is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        path, endpoint, kwargs = deferred
        before = dict(self.__dict__)
        try:
            fastapi_routing.APIRoute.__init__(self, path, endpoint, **kwargs)
        except BaseException:  # refused: back as it was, so every use is refused alike
            self.__dict__.clear()
            self.__dict__.update(before, _deferred=deferred)
            raise
        return getattr(self, name)


def router(**kwargs: Any) -> APIRouter:
    """An :class:`~fastapi.APIRouter` of :class:`DeferredRoute` (its arguments as given)."""
    kwargs.setdefault("route_class", DeferredRoute)
    return APIRouter(**kwargs)

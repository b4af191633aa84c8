"""The HTTP API: FastAPI routers, one per resource, over :class:`crawlhub.services.Services`.

The ASGI app that mounts them (with the web page) is :func:`crawlhub.app.asgi.create_app`.

Importing this package imports FastAPI with the build of its OpenAPI models deferred
(:func:`import_fastapi`), and without its probe for pydantic v1 models importing
``pydantic.v1`` (:func:`skip_v1_probe`).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def deferred_builds() -> Iterator[None]:
    """pydantic models defined inside are built where first used, not as their class is
    made (pydantic's ``defer_build``, as the default of the models that set none).

    Building a model (its validator and serializer) is ~0.5-1 ms, paid at import by
    every ``crawlhub serve`` for models only a request, ``GET /openapi.json`` or nothing
    at all in this process uses; pydantic builds a deferred model itself on first
    validation, serialization or schema. The models made after keep the default. Does
    nothing where pydantic keeps its defaults elsewhere."""
    try:
        defaults = importlib.import_module("pydantic._internal._config").config_defaults
    except (ImportError, AttributeError):  # another pydantic: build as it does
        defaults = None
    if not isinstance(defaults, dict) or "defer_build" not in defaults:
        yield
        return
    before = defaults["defer_build"]
    defaults["defer_build"] = True
    try:
        yield
    finally:
        defaults["defer_build"] = before


def import_fastapi() -> None:
    """Import FastAPI with the pydantic models of ``fastapi.openapi.models`` left unbuilt.

    FastAPI defines ~100 models of the OpenAPI document at import, and pydantic builds a
    validator and serializer for each as its class is made: about a third of FastAPI's
    import (``python -X importtime``: 70-140 ms of ~400 here), paid by every
    ``crawlhub serve`` to describe a document only ``GET /openapi.json`` asks for
    (:func:`deferred_builds`). The document is the same either way
    (``tests/api/test_openapi*``). Does nothing once FastAPI is imported."""
    if "fastapi" in sys.modules:
        return
    with deferred_builds():
        importlib.import_module("fastapi")  # (fastapi.openapi.models with it)


def skip_v1_probe() -> None:
    """FastAPI asks of each route's models, and of each object it encodes, whether it is
    a pydantic v1 model by importing ``pydantic.v1`` (its ``is_pydantic_v1_model_*``):
    30-50 ms, paid by ``crawlhub serve``'s first request. No object can be a v1 model
    before ``pydantic.v1`` is imported, so until then the probe answers no at once;
    after, it asks FastAPI's. Does nothing where FastAPI has no such probe."""
    for module_name, name in (("fastapi._compat.shared", "is_pydantic_v1_model_class"),
                              ("fastapi.encoders", "is_pydantic_v1_model_instance")):
        module = sys.modules.get(module_name)
        probe = getattr(module, name, None)
        if callable(probe) and not hasattr(probe, "__wrapped__"):
            setattr(module, name, _unless_v1_imported(probe))


def _unless_v1_imported(probe: Callable[[Any], bool]) -> Callable[[Any], bool]:
    @functools.wraps(probe)
    def without_v1(obj: Any) -> bool:
        return "pydantic.v1" in sys.modules and probe(obj)

    return without_v1


import_fastapi()
skip_v1_probe()

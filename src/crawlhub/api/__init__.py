"""The HTTP API: FastAPI routers, one per resource, over :class:`crawlhub.services.Services`.

The ASGI app that mounts them (with the web page) is :func:`crawlhub.app.asgi.create_app`.

Importing this package imports FastAPI with the build of its OpenAPI models deferred
(:func:`import_fastapi`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager


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


import_fastapi()

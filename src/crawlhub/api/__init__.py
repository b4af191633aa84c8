"""The HTTP API: FastAPI routers, one per resource, over :class:`crawlhub.services.Services`.

The ASGI app that mounts them (with the web page) is :func:`crawlhub.app.asgi.create_app`.

Importing this package imports FastAPI with the build of its OpenAPI models deferred
(:func:`import_fastapi`).
"""

from __future__ import annotations

import importlib
import sys


def import_fastapi() -> None:
    """Import FastAPI with the pydantic models of ``fastapi.openapi.models`` left unbuilt.

    FastAPI defines ~100 models of the OpenAPI document at import, and pydantic builds a
    validator and serializer for each as its class is made: about a third of FastAPI's
    import (``python -X importtime``: 70-140 ms of ~400 here), paid by every
    ``crawlhub serve`` to describe a document only ``GET /openapi.json`` asks for. With
    pydantic's ``defer_build`` set while that module runs, each is built where it is
    first used instead (pydantic does that itself); the models made after keep the
    default. The document is the same either way (``tests/api/test_openapi*``). Does
    nothing once FastAPI is imported, or where pydantic keeps its defaults elsewhere (the
    import is then only not deferred)."""
    if "fastapi" in sys.modules:
        return
    try:
        defaults = importlib.import_module("pydantic._internal._config").config_defaults
    except (ImportError, AttributeError):  # another pydantic: import as it is
        defaults = None
    if not isinstance(defaults, dict) or "defer_build" not in defaults:
        importlib.import_module("fastapi")
        return
    before = defaults["defer_build"]
    defaults["defer_build"] = True
    try:
        importlib.import_module("fastapi")  # (fastapi.openapi.models with it)
    finally:
        defaults["defer_build"] = before


import_fastapi()

"""What the OpenAPI document says about the answers: error bodies, the statuses each
route can give, and the JSON bodies that routes read themselves (``json_body``). The
bodies of successful answers are in :mod:`crawlhub.api.models`.

Routes list their statuses with :func:`errors`; the 422 of every route is the shape the
validation handler really sends (``detail`` + ``errors``), not FastAPI's default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.models import Schema
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema

from crawlhub.api.guard import CROSS_SITE_PREFIXES, SAFE_METHODS
from crawlhub.core.configtypes import new_list


class ErrorBody(BaseModel):
    """Every error answer: ``detail`` says what is wrong and how to fix it. Some answers
    add fields: ``task_uuid`` (a task not routed), ``invalid_items`` (items that are not
    objects), ``accepted`` / ``tasks`` (a list of which no task was routed)."""

    model_config = ConfigDict(extra="allow")
    detail: str


class Problem(BaseModel):
    where: str = Field(description="where in the request, e.g. 'body.n'")
    problem: str = Field(description="what is wrong there")
    type: str = Field(description="a machine-readable kind, e.g. 'less_than_equal'")


class ValidationErrorBody(BaseModel):
    """A request that does not match its schema: the first problem in ``detail``, all of
    them in ``errors``."""

    model_config = ConfigDict(extra="allow")
    detail: str
    errors: list[Problem] = Field(default_factory=new_list)


class RetryLater(BaseModel):
    """Try again after ``Retry-After`` seconds: a backend is out of reach (``detail`` and
    ``backend``, its redacted URL or name), an outbound is over its ``max_lag`` (``detail``
    and ``retry_after``), or some tasks were deferred (the usual 200 answer, with the
    status ``deferred`` on those tasks)."""

    model_config = ConfigDict(extra="allow")
    detail: str | None = None
    backend: str | None = None


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again",
                                "schema": {"type": "integer", "minimum": 1}}}

_ANSWERS: dict[int, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is empty, not UTF-8, not JSON, too"
          " deeply nested, or holds a number or text JSON cannot carry"},
    404: {"model": ErrorBody, "description": "No such inbound, outbound prefix, frontier or"
          " job (or no jobs configured)"},
    408: {"model": ErrorBody, "description": "The body did not arrive within"
          " server.body_timeout; the connection is closed"},
    409: {"model": ErrorBody, "description": "Refused in the current state: the inbound is"
          " disabled or not of class http, the job is disabled or already running"},
    413: {"model": ErrorBody, "description": "The body is over server.max_body_bytes, or"
          " holds more items than server.max_tasks_per_request"},
    422: {"model": ValidationErrorBody, "description": "The request does not match its"
          " schema, an item is not a JSON object, or no outbound takes the task"},
    403: {"model": ErrorBody, "description": "Sent from a page of another origin (Origin,"
          " Sec-Fetch-Site), or with the session cookie alone and no CSRF header"},
    415: {"model": ErrorBody, "description": "A body that is not JSON: send Content-Type:"
          " application/json"},
    421: {"model": ErrorBody, "description": "Host is not a name this server answers to"
          " (loopback names, its address, server.allowed_hosts): DNS-rebinding guard"},
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token (server.token"
          " is set)"},
    429: {"model": ErrorBody, "description": "Too many at once from this client: wrong"
          " tokens, or open log tails (server.max_tails_per_client, server.max_tails);"
          " retry after Retry-After seconds", "headers": _RETRY_AFTER},
    503: {"model": RetryLater, "description": "A backend is out of reach (or an outbound is"
          " over its max_lag): retry after Retry-After seconds", "headers": _RETRY_AFTER},
}

#: The models of :data:`_ANSWERS`, which :func:`install` adds to the document.
_ERROR_MODELS = (ErrorBody, ValidationErrorBody, RetryLater)


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entry of a route that can answer ``statuses``: each answer's
    body by ``$ref`` (:func:`_response`), not by model - FastAPI would build a field
    (a pydantic TypeAdapter) per route and status for the document alone, ~300 of them
    at start-up; :func:`install` puts the error models in the document's components."""
    return {status: _response(status) for status in statuses}


#: Statuses of every route that reads a body (bad bytes, too slow) or touches a backend.
BODY = (400, 408, 413, 422)
BACKEND = (503,)

_OBJECT = {"type": "object", "additionalProperties": True,
           "example": {"url": "https://example.com/item/1", "task_src": 1}}


def json_request(description: str, *, max_items: int | None = None) -> dict[str, Any]:
    """``openapi_extra`` declaring a body of one JSON object or a list of them (routes that
    read it with ``json_body`` rather than a model)."""
    array: dict[str, Any] = {"type": "array", "items": _OBJECT, "minItems": 1}
    if max_items is not None:
        array["maxItems"] = max_items
    return {"requestBody": {
        "required": True, "description": description,
        "content": {"application/json": {"schema": {"anyOf": [_OBJECT, array]}}},
    }}


def install(app: FastAPI, *, token_paths: Callable[[str], bool] | None = None) -> None:
    """Make ``app.openapi()`` describe the 422 the validation handler really sends
    (FastAPI's default ``HTTPValidationError`` becomes :class:`ValidationErrorBody`), the
    request guard's 421 (and 403, 415 on what changes something), and 401 on the paths
    for which ``token_paths`` says a bearer token is needed."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = generate()
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        # the error bodies the routes refer to by $ref (errors()), as FastAPI lists a
        # response model (serialization schemas, components sorted by name: below)
        used = json.dumps(doc.get("paths", {}))
        wanted = _error_schemas()
        while added := [name for name in wanted if name not in schemas
                        and f'"#/components/schemas/{name}"' in used]:
            for name in added:  # (and then those they refer to: Problem)
                schemas[name] = wanted[name]
                used += json.dumps(wanted[name])
        for path, item in doc.get("paths", {}).items():
            # the request guard's answers (crawlhub.api.guard), before any route
            for method, operation in item.items():
                if not isinstance(operation, dict):
                    continue
                answers = operation.setdefault("responses", {})
                answers.setdefault("421", _response(421))
                if method.upper() not in SAFE_METHODS \
                        and not path.startswith(CROSS_SITE_PREFIXES):
                    answers.setdefault("403", _response(403))
                    answers.setdefault("415", _response(415))
        if token_paths is not None:
            for path, item in doc.get("paths", {}).items():
                if token_paths(path):
                    for operation in item.values():
                        operation.setdefault("responses", {}).setdefault(
                            "401", _response(401))
        default = schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        if default is not None:
            for name, schema in _schemas(ValidationErrorBody).items():
                schemas.setdefault(name, schema)
            for operation in _operations(doc):
                answer = operation.get("responses", {}).get("422")
                if answer is not None and "HTTPValidationError" in str(answer):
                    operation["responses"]["422"] = _response(422)
        doc["components"]["schemas"] = dict(sorted(schemas.items()))
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _response(status: int) -> dict[str, Any]:
    """The OpenAPI response object of :data:`_ANSWERS` ``[status]`` (its model by $ref)."""
    answer = _ANSWERS[status]
    out = {k: v for k, v in answer.items() if k != "model"}
    out["content"] = {"application/json": {"schema": {
        "$ref": f"#/components/schemas/{answer['model'].__name__}"}}}
    return out


def _error_schemas() -> dict[str, Any]:
    """The components of the error bodies, generated as FastAPI generates those of
    response models: each model (and each it refers to) on its own, serialization mode,
    descriptions cut at a form feed."""
    models: list[type[BaseModel]] = [*_ERROR_MODELS, Problem]
    generator = GenerateJsonSchema(ref_template="#/components/schemas/{model}")
    _, definitions = generator.generate_definitions(
        inputs=[(model, "serialization", TypeAdapter(model).core_schema) for model in models])
    out: dict[str, Any] = {}
    for name, schema in definitions.items():
        if "description" in schema:
            schema["description"] = schema["description"].split("\f")[0]
        # (through the document's own model, as FastAPI passes its whole document)
        out[name] = jsonable_encoder(Schema(**schema), by_alias=True, exclude_none=True)
    return out


def _schemas(model: type[BaseModel]) -> dict[str, Any]:
    """JSON schemas of ``model`` and the models it refers to, by component name."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {model.__name__: schema, **defs}


def _operations(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in doc.get("paths", {}).values() for op in item.values()
            if isinstance(op, dict)]

"""The main answers have models (``crawlhub.api.models``) that the OpenAPI document names
and the web page reuses; the answers are exactly those models. Errors come from the app's
one mapping, whatever router raised them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from crawlhub.api import models
from tests.api.conftest import MakeApi

#: GET routes and the model of their 200 answer (a list of it when the answer is a list).
ANSWERS = {
    "/inbound/": ("InboundRow", True),
    "/outbound/": ("OutboundRow", True),
    "/queues/": ("QueueStatsRow", True),
    "/agents/": ("AgentList", False),
    "/frontier/": ("FrontierStats", True),
    "/frontier/{name}": ("FrontierStats", False),
    "/healthz": ("Health", False),
}


def answer_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    schema: dict[str, Any] = (doc["paths"][path]["get"]["responses"]["200"]["content"]
                              ["application/json"]["schema"])
    return schema


async def test_the_openapi_document_names_the_model_of_each_main_answer(
        make_api: MakeApi) -> None:
    api = await make_api(frontier={"web": {"expected_items": 1000}})
    doc = (await api.client.get("/openapi.json")).json()
    for path, (name, many) in ANSWERS.items():
        schema = answer_schema(doc, path)
        ref = schema["items"]["$ref"] if many else schema["$ref"]
        assert ref == f"#/components/schemas/{name}", path
        assert name in models.__all__ and name in doc["components"]["schemas"]


@pytest.mark.parametrize(("path", "model", "many"), [
    ("/inbound/", models.InboundRow, True), ("/outbound/", models.OutboundRow, True),
    ("/queues/", models.QueueStatsRow, True), ("/agents/", models.AgentList, False),
    ("/frontier/web", models.FrontierStats, False), ("/healthz", models.Health, False),
])
async def test_each_answer_is_its_model_and_nothing_is_dropped(
        make_api: MakeApi, path: str, model: type[BaseModel], many: bool) -> None:
    api = await make_api(frontier={"web": {"expected_items": 1000}})
    await api.client.post("/task/", json={"url": "https://a.example/"})
    body = (await api.client.get(path)).json()
    for item in body if many else [body]:
        parsed = model.model_validate(item)
        assert parsed.model_dump(mode="json", by_alias=True) == item


@pytest.mark.parametrize(("method", "path", "status", "detail"), [
    ("POST", "/inbound/nope/", 404, "no inbound named 'nope'"),
    ("POST", "/inbound/nope/check_task/", 404, "no inbound named 'nope'"),
    ("GET", "/outbound/zz", 404, "no outbound name starts with 'zz'"),
    ("GET", "/frontier/nope", 404, "no frontier named 'nope'; known: web"),
    ("POST", "/inbound/off/", 409, "inbound 'off' is disabled"),
    ("GET", "/center/jobs/", 409, "no download center is configured"),
    ("POST", "/queues/a%20b/ack", 400, "queue name 'a b' is invalid"),
])
async def test_errors_raised_below_the_routers_get_their_status_once_in_the_app(
        make_api: MakeApi, method: str, path: str, status: int, detail: str) -> None:
    api = await make_api(frontier={"web": {"expected_items": 1000}},
                         inbound=[{"name": "http", "class": "http"},
                                  {"name": "off", "class": "http", "disable": True}])
    body = {"ids": ["1"]} if path.startswith("/queues/") else {"url": "https://a.example/"}
    response = await api.client.request(method, path, json=body if method == "POST" else None)
    assert response.status_code == status, response.text
    assert response.json() == {"detail": response.json()["detail"]}
    assert detail in response.json()["detail"]

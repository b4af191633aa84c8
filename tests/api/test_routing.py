"""Routes analysed where they are served (crawlhub.api.routing): none at import or at
create_app, the same OpenAPI document and answers as eager routes, and a route used
directly still whole."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, APIRouter
from fastapi.testclient import TestClient
from pydantic import BaseModel

from crawlhub.api import routing
from crawlhub.app import asgi
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.web import routes as web_routes


def _routers() -> list[APIRouter]:
    return [module.router for module in asgi.ROUTERS] + list(web_routes.ROUTERS)


def _deferred(router: APIRouter) -> list[str]:
    return [route.path for route in router.routes if "_deferred" in route.__dict__]


def _config(tmp_path: Any) -> CrawlhubConfig:
    return CrawlhubConfig.model_validate({"data_dir": str(tmp_path)})


def test_no_route_is_analysed_until_a_request_reaches_its_router(tmp_path: Any) -> None:
    routers = _routers()
    assert all(isinstance(route, routing.DeferredRoute) for r in routers for route in r.routes)
    app = asgi.create_app(_config(tmp_path))
    before = sum(len(_deferred(router)) for router in routers)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/queues").status_code == 200
    # The app served them through its included copies: the routes defined at import were
    # never analysed (each would have cost ~1 ms of start-up), before or after.
    assert before == sum(len(router.routes) for router in routers) > 80
    assert sum(len(_deferred(router)) for router in routers) == before


def _eager(app: FastAPI, routers: list[APIRouter]) -> FastAPI:
    """The same app, its routers rebuilt of plain APIRoutes from the same arguments."""
    eager = FastAPI(title=app.title, version=app.version, description=app.description,
                    docs_url=None, redoc_url=None)
    asgi.openapi.install(eager, token_paths=None)  # as create_app does without a token
    for index, router in enumerate(routers):
        copy = APIRouter()
        for route in router.routes:
            path, endpoint, kwargs = route.__dict__["_deferred"]
            copy.routes.append(APIRoute(path, endpoint, **kwargs))
        eager.include_router(copy, include_in_schema=index < len(asgi.ROUTERS))
    return eager


def test_the_openapi_document_is_the_one_eager_routes_give(tmp_path: Any) -> None:
    routers = _routers()
    app = asgi.create_app(_config(tmp_path))
    document = app.openapi()
    eager = _eager(app, routers).openapi()
    assert document["paths"] == eager["paths"]
    assert document["components"]["schemas"] == eager["components"]["schemas"]
    assert len(document["paths"]) > 40


class Item(BaseModel):
    name: str
    size: int = 1


def _item(item: Item, limit: int = 5) -> Item:
    """Echo, capped."""
    return Item(name=item.name, size=min(item.size, limit))


def test_a_deferred_route_used_on_its_own_is_built_whole_on_first_use() -> None:
    router = routing.router(tags=["items"])
    router.post("/items", status_code=201)(_item)
    route = router.routes[0]
    assert "_deferred" in route.__dict__ and route.description == "Echo, capped."
    # served directly (not through an include): the handler builds the route
    app = FastAPI()
    app.router.routes.extend(router.routes)
    with TestClient(app) as client:
        answer = client.post("/items?limit=3", json={"name": "a", "size": 9})
        assert (answer.status_code, answer.json()) == (201, {"name": "a", "size": 3})
        refused = client.post("/items", json={"size": "x"})
        assert refused.status_code == 422
        assert {e["loc"][-1] for e in refused.json()["detail"]} == {"name", "size"}
    assert "_deferred" not in route.__dict__
    assert route.response_model is Item and route.body_field is not None
    assert route.tags == ["items"] and route.unique_id == "_item_items_post"
    try:
        route.no_such_thing  # noqa: B018 - built once, a missing attribute stays missing
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("an unknown attribute was answered")


def test_models_made_in_deferred_builds_are_built_on_first_use_and_only_those() -> None:
    from pydantic import ValidationError

    from crawlhub.api import deferred_builds
    from crawlhub.api.models import Health

    with deferred_builds():
        class Late(BaseModel):
            size: int

    class Eager(BaseModel):
        size: int

    assert (Late.__pydantic_complete__, Eager.__pydantic_complete__) == (False, True)
    assert Late(size="3").size == 3 and Late.__pydantic_complete__
    try:
        Late(size="x")
    except ValidationError as exc:
        assert exc.errors()[0]["loc"] == ("size",)
    else:
        raise AssertionError("a bad size was taken")
    # an error inside the window restores pydantic's default
    try:
        with deferred_builds():
            raise RuntimeError("boom")
    except RuntimeError:
        pass

    class After(BaseModel):
        size: int

    assert After.__pydantic_complete__
    # the API's own models, imported by crawlhub.app.asgi inside the window, work alike
    assert Health.model_json_schema()["title"] == "Health"


def test_a_route_fastapi_refuses_is_refused_on_every_use_not_only_the_first() -> None:
    router = routing.router()

    @router.get("/empty", status_code=204)
    def empty() -> dict[str, int]:
        return {}

    route = router.routes[0]
    for _ in range(2):
        try:
            route.dependant  # noqa: B018 - the use that builds it
        except AssertionError as exc:
            assert "204 must not have a response body" in str(exc)
        else:
            raise AssertionError("a 204 route with a response body was built")


def test_no_model_of_crawlhub_takes_the_builtin_list_as_a_default_factory() -> None:
    """pydantic parses ``list``'s signature from text with the tokenizer (~0.1 ms a field,
    ~5 ms the first): serve's models use crawlhub.core.configtypes.new_list instead."""
    import crawlhub.config.schema  # noqa: F401 - every section's models

    def models(cls: type[BaseModel]) -> list[type[BaseModel]]:
        return [cls, *(m for sub in cls.__subclasses__() for m in models(sub))]

    found = [f"{m.__module__}.{m.__qualname__}.{name}" for m in models(BaseModel)
             if m.__module__.startswith("crawlhub.")
             for name, field in m.model_fields.items() if field.default_factory is list]
    assert found == []
    assert any(m.__module__ == "crawlhub.config.schema" for m in models(BaseModel))


def test_serving_imports_no_pydantic_v1_and_a_v1_model_is_still_told_apart(tmp_path: Any) -> None:
    """FastAPI's probe for pydantic v1 models imports ``pydantic.v1`` (30-50 ms of
    serve's start-up): a served request imports it no more, and once something imports
    it, FastAPI tells a v1 model apart as before (its routes and its encoder)."""
    script = """
import sys, warnings
from fastapi.testclient import TestClient
from crawlhub.app.asgi import create_app
from crawlhub.config import default_config
cfg = default_config(None, overrides={"data_dir": sys.argv[1]})
with TestClient(create_app(cfg)) as client:
    assert client.get("/healthz").status_code == 200
    assert client.get("/queues/").status_code == 200
    assert client.get("/openapi.json").status_code == 200
print("pydantic.v1" in sys.modules)
import fastapi._compat.shared as shared
import fastapi.encoders as encoders
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from pydantic import v1
    class Old(v1.BaseModel):
        size: int
for probe, obj in ((shared.is_pydantic_v1_model_class, Old),
                   (encoders.is_pydantic_v1_model_instance, Old(size=3))):
    print(probe(obj), probe.__wrapped__(obj), probe(int), probe(3))
print(shared.annotation_is_pydantic_v1(list[Old]))
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["False", "True True False False",
                                           "True True False False", "True"]

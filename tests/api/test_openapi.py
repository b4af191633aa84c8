"""The OpenAPI document matches the answers: schemathesis sends requests built from the
document (valid and invalid) to the app in process and checks every answer against it.

Bounded and derandomized (the same examples every run) so it stays a fast, stable test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig
from schemathesis.python import asgi

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig

MAX_EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance,
          negative_data_rejection]


# A request the document calls invalid must get one of these (never a 5xx): 413 is how a
# body over server.max_body_bytes is refused, whatever else is wrong with it.
SETTINGS = SchemathesisConfig.from_dict({
    "checks": {"negative_data_rejection": {
        "expected-statuses": [400, 401, 404, 405, 409, 413, 415, 422]}},
    # the live tail never ends by itself: cut each call short
    "operations": [{"include-path": "/logs/tail", "request-timeout": 0.3}]})


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    data = tmp_path_factory.mktemp("openapi")
    config = CrawlhubConfig.model_validate({
        "data_dir": str(data),
        "storage": {"queues": f"sqlite:///{data}/queues.db",
                    "state": f"sqlite:///{data}/hub.db",
                    "frontier": f"sqlite:///{data}/frontier.db"},
        "failure": {"path": str(data / "failures.jsonl")},
        "frontier": {"web": {"expected_items": 1000}},
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": [
            {"name": "gd", "selector": ["province == 'GD'"], "init": {"key": "gd"},
             "task_params": ["url"], "task_src": 3},
            {"name": "pages", "selector": ["url"], "frontier": "web", "init": {"key": "pages"}},
            {"name": "default", "init": {"key": "default"}},
        ],
        "server": {"max_body_bytes": 20_000, "max_tasks_per_request": 20},
    })
    # The app opens its services itself (lifespan), in schemathesis's event loop.
    yield schemathesis.openapi.from_asgi("/openapi.json", create_app(config), config=SETTINGS)
    asgi.shutdown_lifespans()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_answer_matches_the_openapi_document(api_schema: Any, mode: GenerationMode
                                                   ) -> None:
    # schemathesis' own pytest plugin (from_fixture) does not run on pytest 9: drive its
    # strategies with hypothesis directly, every operation, collecting all failures.
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        def check(case: Any) -> None:
            case.call_and_validate(checks=CHECKS)

        try:
            check()
        except Unsatisfiable:  # nothing in this operation can be made invalid
            assert mode is GenerationMode.NEGATIVE, operation.label
        except Exception as exc:  # noqa: BLE001 - reported below, with the operation
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)


def test_every_ref_of_the_document_names_a_component_and_error_bodies_are_listed(
        tmp_path: Any) -> None:
    # routes declare their error answers by $ref (crawlhub.api.openapi.errors): the
    # document must still carry each body it refers to
    import json
    import re

    app = create_app(CrawlhubConfig.model_validate({"data_dir": str(tmp_path)}))
    doc = app.openapi()
    schemas = doc["components"]["schemas"]
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(doc)))
    assert {"ErrorBody", "ValidationErrorBody", "Problem", "RetryLater"} <= refs
    assert sorted(refs - set(schemas)) == []
    assert list(schemas) == sorted(schemas)
    assert "HTTPValidationError" not in schemas
    problem = schemas["ValidationErrorBody"]["properties"]["errors"]
    assert problem["items"] == {"$ref": "#/components/schemas/Problem"}

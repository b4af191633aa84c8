"""No request body, however odd, makes ``POST /task/`` or ``POST /inbound/{name}/`` answer
5xx: random JSON values, JSON-ish token soup and random bytes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core.task import BUILTIN_KEYS
from crawlhub.services import Services

scalars = (st.none() | st.booleans() | st.integers() | st.floats()
           | st.text(st.characters(), max_size=20))
keys = st.sampled_from([*BUILTIN_KEYS, "task_result", "url", "province", "n"]) | st.text(
    max_size=8)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children,
                                                                      max_size=6),
    max_leaves=25,
)
tasks = st.dictionaries(keys, json_values, max_size=8)
bodies = json_values | tasks | st.lists(tasks, max_size=6)

TOKENS = ['{', '}', '[', ']', ',', ':', '"url"', '"task_uuid"', '"task_result"', '"\\ud800"',
          '"\\udc00\\ud800"', '"\\ud83d\\ude00"', 'NaN', '-Infinity', '1e999', '-0', '1.5e-400',
          'true', 'null', '"' + 'x' * 50 + '"', '0' * 30, '9' * 4400, ' ', '\n', '\\', '"']
soup = st.lists(st.sampled_from(TOKENS), max_size=40).map(lambda t: "".join(t).encode())
raw_bodies = soup | st.binary(max_size=200)

PATHS = ["/task/", "/inbound/http/", "/inbound/http/check_task/"]


class App:
    """One app over real SQLite services, driven from sync hypothesis tests."""

    def __init__(self, data_dir: Path) -> None:
        self.runner = asyncio.Runner()
        cfg = CrawlhubConfig.model_validate({
            "data_dir": str(data_dir),
            "inbound": [{"name": "http", "class": "http"}],
            "outbound": [
                {"name": "gd", "selector": ["int(task_src) in [1, 3] and province == 'GD'"],
                 "init": {"key": "gd"}, "task_params": ["url", "n"], "task_src": 3},
                {"name": "by_url", "selector": ["url and len(url) > 3"],
                 "task_params_wrapped": True, "init": {"key": "urls"}},
            ],
            "server": {"max_body_bytes": 100_000},
        })
        cfg.storage.queues = f"sqlite:///{data_dir}/queues.db"
        cfg.storage.state = f"sqlite:///{data_dir}/hub.db"
        cfg.failure.path = str(data_dir / "failures.jsonl")
        self.svc = self.runner.run(Services.open(cfg))
        transport = httpx2.ASGITransport(app=create_app(services=self.svc),
                                         raise_app_exceptions=False)
        self.client = httpx2.AsyncClient(transport=transport, base_url="http://crawlhub.test")

    def post(self, path: str, content: bytes) -> httpx2.Response:
        return self.runner.run(self.client.post(
            path, content=content, headers={"content-type": "application/json"}))

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.run(self.svc.close())
        self.runner.close()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    served = App(tmp_path)
    yield served
    served.close()


def _check(response: httpx2.Response) -> None:
    assert response.status_code < 500, response.text
    assert isinstance(response.json(), dict | list)


FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def test_random_json_bodies_never_get_a_5xx(app: App) -> None:
    @FUZZ
    @given(body=bodies, path=st.sampled_from(PATHS))
    def check(body: Any, path: str) -> None:
        _check(app.post(path, json.dumps(body).encode()))

    check()


def test_random_bytes_and_json_token_soup_never_get_a_5xx(app: App) -> None:
    @FUZZ
    @given(raw=raw_bodies, path=st.sampled_from(PATHS))
    def check(raw: bytes, path: str) -> None:
        _check(app.post(path, raw))

    check()


def test_random_queue_requests_never_get_a_5xx(app: App) -> None:
    ids = st.lists(st.text(max_size=25) | st.integers().map(str), max_size=5)
    queue_bodies = (st.fixed_dictionaries({"ids": ids}, optional={"dead": json_values})
                    | st.fixed_dictionaries({}, optional={"n": json_values,
                                                          "visibility_timeout": json_values})
                    | json_values)

    @FUZZ
    @given(name=st.text(min_size=1, max_size=30) | st.just("gd"),
           op=st.sampled_from(["lease", "ack", "nack"]), body=queue_bodies)
    def check(name: str, op: str, body: Any) -> None:
        _check(app.post(f"/queues/{quote(name, safe='')}/{op}", json.dumps(body).encode()))

    check()


def test_results_for_random_known_tasks_never_get_a_5xx(app: App) -> None:
    routed = app.post("/task/", json.dumps([{"url": f"https://x/{i}"} for i in range(50)])
                      .encode()).json()["tasks"]
    uuids = [t["task_uuid"] for t in routed]

    @FUZZ
    @given(uuid=st.sampled_from(uuids), code=scalars | json_values, extra=tasks)
    def check(uuid: str, code: Any, extra: dict[str, Any]) -> None:
        message = {**extra, "task_uuid": uuid, "task_result": code}
        for path in ("/inbound/http/check_task/", "/inbound/http/"):
            _check(app.post(path, json.dumps(message).encode()))

    check()

"""A backend outage is a 503 with Retry-After and a JSON body {detail, backend} on every
route that needs the backend, never a 500 or 400; the body carries no password; the
keep-alive connection stays usable; GET /outbound/ still lists what it can reach."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.requests import Request

from crawlhub.api.errors import backend_error
from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core.errors import BackendUnavailable, QueueError
from crawlhub.services import Services
from tests.api.live import HTTP_IMPLEMENTATIONS, PASSWORD, Answer, SpareRedis, call, serve


@pytest.fixture
def spare() -> Iterator[SpareRedis]:
    server = SpareRedis()
    try:
        yield server
    finally:
        server.close()


def config(tmp_path: Path, **sections: Any) -> CrawlhubConfig:
    storage = {"queues": f"sqlite:///{tmp_path}/queues.db",
               "state": f"sqlite:///{tmp_path}/hub.db",
               "frontier": f"sqlite:///{tmp_path}/frontier.db",
               **sections.pop("storage", {})}
    sections.setdefault("inbound", [{"name": "http", "class": "http"}])
    sections.setdefault("outbound", [{"name": "default", "init": {"key": "default"}}])
    return CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "storage": {"redis_prefix": "outage:", **storage},
        "failure": {"path": str(tmp_path / "failures.jsonl")}, **sections})


def assert_unavailable(status: int, headers: Any, body: Any, text: str, backend: bool) -> None:
    """503, Retry-After, a JSON body that says why (and which backend), no password."""
    assert status == 503, text
    assert int(headers["retry-after"]) >= 1
    assert body["detail"], body
    assert PASSWORD not in text
    if backend:  # answered by the outage handler, not by the per-task answer of intake
        assert set(body) == {"detail", "backend"} and body["backend"], body
        assert "unavailable" in body["detail"]


def unavailable(answer: Answer, *, backend: bool = True) -> None:
    assert_unavailable(answer.status, answer.headers, answer.body, answer.text, backend)


def unavailable_asgi(response: httpx2.Response, *, backend: bool = True) -> None:
    assert_unavailable(response.status_code, response.headers, response.json(),
                       response.text, backend)


@pytest.mark.parametrize("http_impl", HTTP_IMPLEMENTATIONS)
def test_an_outbound_whose_redis_is_down_is_503_and_the_connection_stays_usable(
        tmp_path: Path, spare: SpareRedis, http_impl: str) -> None:
    app = create_app(config(tmp_path, outbound=[
        {"name": "remote", "class": "redis_list", "selector": ["site == 'remote'"],
         "init": {"url": spare.url, "key": "remote"}},
        {"name": "default", "init": {"key": "default"}},
    ]))
    with serve(app, http=http_impl) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        assert call(conn, "POST", "/task/", {"site": "remote"}).status == 200
        spare.stop()
        unavailable(call(conn, "POST", "/task/", {"site": "remote"}), backend=False)
        unavailable(call(conn, "POST", "/inbound/http/", {"site": "remote"}), backend=False)
        sock = conn.sock
        # The same connection goes on: other outbounds still take tasks...
        local = call(conn, "POST", "/task/", {"site": "local"})
        assert local.status == 200 and local.body["outbound"] == "default"
        # ...and the listing shows what it can reach, marking the rest unavailable.
        listing = call(conn, "GET", "/outbound/")
        assert conn.sock is sock and sock is not None
        assert listing.status == 200, listing.text
        rows = {row["name"]: row for row in listing.body}
        assert rows["default"]["available"] is True and rows["default"]["queue_length"] == 1
        assert rows["remote"]["available"] is False and rows["remote"]["queue_length"] is None
        assert "ConnectionError" in rows["remote"]["error"]
        assert PASSWORD not in listing.text
        by_prefix = call(conn, "GET", "/outbound/rem")
        assert by_prefix.status == 200 and by_prefix.body[0]["available"] is False
        conn.close()


async def open_api(cfg: CrawlhubConfig) -> tuple[Services, httpx2.AsyncClient]:
    svc = await Services.open(cfg)
    transport = httpx2.ASGITransport(app=create_app(services=svc), raise_app_exceptions=False)
    return svc, httpx2.AsyncClient(transport=transport, base_url="http://crawlhub.test")


async def test_queue_storage_down_is_503_on_every_queue_route_and_on_intake(
        tmp_path: Path, spare: SpareRedis) -> None:
    svc, client = await open_api(config(tmp_path, storage={"queues": spare.url}))
    try:
        assert (await client.post("/task/", json={"url": "https://a.example/"})).status_code == 200
        [leased] = (await client.post("/queues/default/lease", json={"n": 1})).json()
        spare.stop()
        unavailable_asgi(await client.get("/queues/"))
        unavailable_asgi(await client.post("/queues/default/lease", json={"n": 1}))
        unavailable_asgi(await client.post("/queues/default/ack",
                                           json={"ids": [leased["receipt"]]}))
        unavailable_asgi(await client.post("/queues/default/nack", json={"ids": [leased["id"]]}))
        unavailable_asgi(await client.post("/task/", json={"url": "https://b.example/"}),
                         backend=False)
        unavailable_asgi(await client.post("/inbound/http/", json={"url": "https://c.example/"}),
                         backend=False)
        # Hub state is fine, so the listing answers, every queue outbound marked unavailable.
        listing = await client.get("/outbound/")
        assert listing.status_code == 200
        assert [row["available"] for row in listing.json()] == [False]
        assert PASSWORD not in listing.text
    finally:
        await client.aclose()
        await svc.close()


async def test_a_refused_login_is_503_without_the_password(
        tmp_path: Path, spare: SpareRedis) -> None:
    svc, client = await open_api(config(tmp_path, storage={"queues": spare.wrong_password_url}))
    try:
        response = await client.post("/queues/default/lease", json={"n": 1})
        unavailable_asgi(response)
        assert "wrong-" not in response.text
        unavailable_asgi(await client.get("/queues/"))
    finally:
        await client.aclose()
        await svc.close()


async def test_hub_state_down_is_503_on_intake_and_listing(
        tmp_path: Path, spare: SpareRedis) -> None:
    svc, client = await open_api(config(tmp_path, storage={"state": spare.url}))
    try:
        spare.stop()
        unavailable_asgi(await client.post("/task/", json={"url": "https://a.example/"}),
                         backend=False)
        unavailable_asgi(await client.get("/outbound/"))
    finally:
        await client.aclose()
        await svc.close()


async def test_a_frontier_whose_redis_is_down_is_503(tmp_path: Path, spare: SpareRedis) -> None:
    svc, client = await open_api(config(
        tmp_path, storage={"frontier": spare.url}, frontier={"web": {}},
        outbound=[{"name": "pages", "selector": ["url"], "frontier": "web",
                   "init": {"key": "pages"}}, {"name": "default"}]))
    try:
        assert (await client.get("/frontier/web")).status_code == 200
        spare.stop()
        unavailable_asgi(await client.get("/frontier/"))
        unavailable_asgi(await client.get("/frontier/web"))
        unavailable_asgi(await client.post("/task/", json={"url": "https://a.example/"}),
                         backend=False)
    finally:
        await client.aclose()
        await svc.close()


@pytest.mark.parametrize(("error", "retry_after"), [
    (ConnectionError(f"Error 111 connecting to redis://:{PASSWORD}@10.0.0.1:6379/0"), 1),
    (BackendUnavailable(f"queue at redis://u:{PASSWORD}@h:1/0 is out of reach",
                        backend=f"redis://u:{PASSWORD}@h:1/0", retry_after=2.5), 3),
    (QueueError(f"push to redis://:{PASSWORD}@h/0 failed"), 1),
])
async def test_the_outage_answer_masks_passwords_in_any_error_text(
        error: Exception, retry_after: int) -> None:
    if isinstance(error, QueueError):
        error.__cause__ = ConnectionError("refused")
    request = Request({"type": "http", "method": "GET", "path": "/queues/", "headers": [],
                       "query_string": b""})
    response = await backend_error(request, error)
    text = bytes(response.body).decode()
    assert response.status_code == 503 and PASSWORD not in text
    assert response.headers["retry-after"] == str(retry_after)


async def test_a_backend_error_that_is_not_an_outage_is_a_500_json() -> None:
    request = Request({"type": "http", "method": "GET", "path": "/x", "headers": [],
                       "query_string": b""})
    response = await backend_error(request, QueueError("invalid queue name 'a b'"))
    assert response.status_code == 500
    assert b"internal error: QueueError" in bytes(response.body)

"""``/alerts/``: routes over the whole app (create, list, change, remove), the test button
against a real webhook receiver, the delivery log, and the URL's token never answered."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from tests.api.conftest import Api, MakeApi
from tests.control.alert_targets import HOOK_PATH, TOKEN, WebhookReceiver


@pytest.fixture
def backend() -> str:
    """The alerts live in the control DB (SQLite here either way): one backend is enough."""
    return "sqlite"


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    server = await WebhookReceiver().start()
    yield server
    await server.stop()


async def app(make_api: MakeApi) -> Api:
    return await make_api(control={"alert_timeout": 2})


async def test_a_route_is_created_listed_changed_and_removed(
        make_api: MakeApi, receiver: WebhookReceiver) -> None:
    api = await app(make_api)
    created = await api.client.post("/alerts/", json={
        "name": "shop-slack", "kind": "webhook", "url": receiver.url(),
        "events": ["run_failed", "run_no_items"], "jobs": ["shop-*"]})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["target"] == f"http://127.0.0.1:{receiver.port}/***"
    assert (body["events"], body["jobs"], body["queues"], body["enabled"]) == (
        ["run_failed", "run_no_items"], ["shop-*"], [], True)

    listed = await api.client.get("/alerts/")
    assert [r["name"] for r in listed.json()] == ["shop-slack"]
    assert (await api.client.get("/alerts/shop-slack")).json() == body

    muted = await api.client.patch("/alerts/shop-slack", json={"enabled": False})
    assert muted.status_code == 200 and muted.json()["enabled"] is False
    mail = await api.client.patch("/alerts/shop-slack", json={
        "kind": "email", "to": ["ops@example.com"]})
    assert mail.json()["target"] == "ops@example.com" and mail.json()["kind"] == "email"

    assert (await api.client.delete("/alerts/shop-slack")).status_code == 204
    missing = await api.client.get("/alerts/shop-slack")
    assert missing.status_code == 404 and "no alert route 'shop-slack'" in missing.json()["detail"]
    assert (await api.client.delete("/alerts/shop-slack")).status_code == 404


async def test_a_taken_name_is_a_409(make_api: MakeApi, receiver: WebhookReceiver) -> None:
    api = await app(make_api)
    route = {"name": "hook", "kind": "webhook", "url": receiver.url()}
    assert (await api.client.post("/alerts/", json=route)).status_code == 201
    again = await api.client.post("/alerts/", json=route)
    assert again.status_code == 409 and "exists" in again.json()["detail"]


@pytest.mark.parametrize("route, where", [
    ({"kind": "webhook", "url": "file:///etc/passwd"}, "body.url"),
    ({"kind": "webhook", "url": "gopher://127.0.0.1:6379/_FLUSHALL"}, "body.url"),
    ({"kind": "webhook", "url": f"ftp://127.0.0.1{HOOK_PATH}"}, "body.url"),
    ({"kind": "webhook"}, "body"),
    ({"kind": "email", "to": []}, "body"),
    ({"kind": "email", "to": ["ops@example.com\r\nBcc: x@example.com"]}, "body.to.0"),
    ({"kind": "sms", "to": ["+1555"]}, "body.kind"),
    ({"kind": "webhook", "url": f"https://h{HOOK_PATH}", "events": ["run_lost"]},
     "body.events.0"),
    ({"name": "../../x", "kind": "webhook", "url": f"https://h{HOOK_PATH}"}, "body.name"),
])
async def test_hostile_routes_are_a_422_that_does_not_repeat_the_url(
        make_api: MakeApi, route: dict[str, object], where: str) -> None:
    api = await app(make_api)
    response = await api.client.post("/alerts/", json={"name": "hook", **route})
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"invalid request: {where}")
    assert TOKEN not in response.text and "/etc/passwd" not in response.text
    assert (await api.client.get("/alerts/")).json() == []


async def test_a_bad_patch_is_a_422(make_api: MakeApi, receiver: WebhookReceiver) -> None:
    api = await app(make_api)
    await api.client.post("/alerts/", json={"name": "mail", "kind": "email",
                                            "to": ["ops@example.com"]})
    response = await api.client.patch("/alerts/mail", json={"to": []})
    assert response.status_code == 422
    assert "an email route needs at least one address" in response.json()["detail"]
    bad_url = await api.client.patch("/alerts/mail", json={"kind": "webhook",
                                                            "url": "file:///x"})
    assert bad_url.status_code == 422


async def test_the_test_button_answers_200_with_the_targets_answer(
        make_api: MakeApi, receiver: WebhookReceiver) -> None:
    api = await app(make_api)
    await api.client.post("/alerts/", json={"name": "hook", "kind": "webhook",
                                            "url": receiver.url()})

    sent = await api.client.post("/alerts/hook/test")
    assert sent.status_code == 200
    assert sent.json()["ok"] is True and sent.json()["answer"] == "HTTP 200"
    assert receiver.hits[0].body["crawlhub"]["event"] == "test"

    receiver.status = 403
    refused = await api.client.post("/alerts/hook/test")
    assert refused.status_code == 200
    assert refused.json()["ok"] is False
    assert refused.json()["error"] == "the webhook answered HTTP 403"

    assert (await api.client.post("/alerts/nope/test")).status_code == 404

    log = (await api.client.get("/alerts/deliveries", params={"route": "hook"})).json()
    assert [(d["event"], d["status"]) for d in log] == [("test", "failed"), ("test", "sent")]
    assert (await api.client.get("/alerts/deliveries", params={"route": "other"})).json() == []
    assert (await api.client.get("/alerts/deliveries",
                                 params={"limit": 0})).status_code == 422


async def test_an_unreachable_target_is_ok_false_not_a_server_error(make_api: MakeApi) -> None:
    api = await app(make_api)
    await api.client.post("/alerts/", json={"name": "down", "kind": "webhook",
                                            "url": f"http://127.0.0.1:9{HOOK_PATH}"})
    answer = await api.client.post("/alerts/down/test")
    assert answer.status_code == 200 and answer.json()["ok"] is False
    assert answer.json()["error"].startswith("cannot connect to http://127.0.0.1:9/***")


async def test_the_webhook_token_is_never_answered_nor_logged(
        make_api: MakeApi, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
        ) -> None:
    caplog.set_level(logging.DEBUG)
    api = await app(make_api)
    url = receiver.url() + f"?sig={TOKEN}"
    answers = [await api.client.post("/alerts/", json={"name": "hook", "kind": "webhook",
                                                       "url": url})]
    answers.append(await api.client.get("/alerts/"))
    answers.append(await api.client.get("/alerts/hook"))
    answers.append(await api.client.patch("/alerts/hook", json={"url": url + "2"}))
    receiver.status = 500
    answers.append(await api.client.post("/alerts/hook/test"))
    answers.append(await api.client.get("/alerts/deliveries"))
    answers.append(await api.client.get("/openapi.json"))

    assert all(a.status_code < 300 for a in answers)
    assert all(TOKEN not in a.text for a in answers)
    assert TOKEN not in "\n".join(r.getMessage() for r in caplog.records
                                  if r.name.startswith("crawlhub"))


async def test_the_routes_are_in_the_openapi_document(make_api: MakeApi) -> None:
    api = await app(make_api)
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    assert set(paths["/alerts/"]) == {"get", "post"}
    assert set(paths["/alerts/{name}"]) == {"get", "patch", "delete"}
    assert "post" in paths["/alerts/{name}/test"] and "get" in paths["/alerts/deliveries"]

"""``server.token``: every endpoint but the public ones wants ``Authorization: Bearer``;
the token itself never appears in any answer."""

from __future__ import annotations

import pytest

from .conftest import Api, MakeApi

TOKEN = "tok-3f9a1c-very-secret"
REDIS_PASSWORD = "redispw-77c1"


@pytest.fixture
async def api(make_api: MakeApi, redis_url: str, unique_name: str) -> Api:
    leg_url = redis_url.replace("redis://", f"redis://:{REDIS_PASSWORD}@", 1)
    return await make_api(server={"token": TOKEN}, outbound=[
        {"name": "leg", "selector": ["leg"], "class": "redis_list",
         "init": {"url": leg_url, "key": f"{unique_name}:leg"}},
        {"name": "default", "init": {"key": "default"}},
    ])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("headers", [
    {}, bearer("wrong"), bearer(""), {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"},
    bearer(TOKEN + "x"), bearer(TOKEN[:-1]),
])
async def test_a_missing_or_wrong_token_is_401_json(api: Api, headers: dict[str, str]) -> None:
    r = await api.client.post("/task/", json={"url": "x"}, headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert "bearer token" in r.json()["detail"]
    assert await api.queued("default") == 0


async def test_the_right_token_is_let_through(api: Api) -> None:
    r = await api.client.post("/task/", json={"url": "x"}, headers=bearer(TOKEN))
    assert r.status_code == 200
    assert await api.queued("default") == 1


@pytest.mark.parametrize("path", ["/outbound/", "/queues/", "/metrics", "/inbound/"])
async def test_reading_endpoints_want_the_token_too(api: Api, path: str) -> None:
    assert (await api.client.get(path)).status_code == 401
    assert (await api.client.get(path, headers=bearer(TOKEN))).status_code == 200


async def test_healthz_and_the_openapi_document_are_open(api: Api) -> None:
    assert (await api.client.get("/healthz")).status_code == 200
    assert (await api.client.get("/openapi.json")).status_code == 200


async def test_the_token_and_backend_passwords_never_appear_in_an_answer(api: Api) -> None:
    ok = bearer(TOKEN)
    answers = [
        await api.client.get("/outbound/", headers=ok),
        await api.client.get("/outbound/leg", headers=ok),
        await api.client.get("/queues/", headers=ok),
        await api.client.get("/inbound/", headers=ok),
        await api.client.get("/metrics", headers=ok),
        await api.client.get("/healthz"),
        await api.client.get("/openapi.json"),
        await api.client.post("/task/", json={"leg": 1}, headers=ok),
        await api.client.post("/task/", content=b"{", headers=ok),
        await api.client.post("/task/", json=[1], headers=ok),
        await api.client.post("/inbound/http/check_task/", json={"leg": 1}, headers=ok),
        await api.client.get("/nowhere", headers=ok),
        await api.client.get("/outbound/", headers=bearer("wrong")),
        await api.client.get("/outbound/"),
    ]
    for r in answers:
        assert r.status_code < 500, r.text
        for secret in (TOKEN, REDIS_PASSWORD):
            assert secret not in r.text, (r.request.url, r.text[:200])
            assert all(secret not in v for v in r.headers.values())

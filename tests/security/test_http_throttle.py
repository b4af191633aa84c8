"""Guessing ``server.token``: past a few wrong tokens a client waits, growing waits
answered 429 with ``Retry-After`` - the right token too, or the answers would tell a
guesser when it hit; other clients are not held; every failure is logged, never the
token."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from crawlhub.api.throttle import FREE_FAILURES
from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.services import Services
from tests.helpers import FakeClock

TOKEN = "throttle-test-token-6a1d9e3f"
FORM = {"Content-Type": "application/x-www-form-urlencoded",
        "Origin": "http://127.0.0.1:8526"}


@dataclass
class App:
    app: object
    svc: Services
    clock: FakeClock

    def client(self, address: str = "127.0.0.1") -> httpx2.AsyncClient:
        transport = httpx2.ASGITransport(app=self.app, client=(address, 4321))
        return httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1:8526")


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    svc = await Services.open(CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "server": {"token": TOKEN},
        "outbound": [{"name": "default", "init": {"key": "default"}}]}))
    app = create_app(services=svc)
    clock = FakeClock()
    app.state.throttle.clock = clock
    try:
        yield App(app, svc, clock)
    finally:
        await svc.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_wrong_bearer_tokens_make_a_client_wait_and_then_the_right_one_waits_too(
        app: App, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "crawlhub.api")
    async with app.client() as client:
        for i in range(FREE_FAILURES):
            r = await client.get("/queues/", headers=bearer(f"guess-{i:012d}"))
            assert r.status_code == 401
        held = await client.get("/queues/", headers=bearer("guess-next-000000"))
        assert held.status_code == 429, held.text
        assert held.headers["Retry-After"] == "1"
        right = await client.get("/queues/", headers=bearer(TOKEN))
        assert right.status_code == 429  # not even compared while it waits
        app.clock.advance(1)
        assert (await client.get("/queues/", headers=bearer(TOKEN))).status_code == 200
        # one more wrong one doubles the wait
        assert (await client.get("/queues/", headers=bearer("guess-again-00000"))
                ).status_code == 401
        again = await client.get("/queues/", headers=bearer(TOKEN))
        assert again.status_code == 429 and again.headers["Retry-After"] == "2"
    failures = [r.getMessage() for r in caplog.records if "wrong bearer token" in r.getMessage()]
    assert len(failures) == FREE_FAILURES + 1
    assert all("127.0.0.1" in line for line in failures)
    assert not any("guess" in r.getMessage() or TOKEN in r.getMessage()
                   for r in caplog.records)


async def test_a_waiting_client_does_not_hold_back_another(app: App) -> None:
    async with app.client("127.0.0.9") as guesser, app.client("127.0.0.1") as operator:
        for i in range(FREE_FAILURES + 3):
            await guesser.get("/queues/", headers=bearer(f"guess-{i:012d}"))
        assert (await guesser.get("/queues/", headers=bearer(TOKEN))).status_code == 429
        assert (await operator.get("/queues/", headers=bearer(TOKEN))).status_code == 200


async def test_requests_without_a_token_are_not_counted(app: App) -> None:
    async with app.client() as client:
        for _ in range(FREE_FAILURES * 3):  # a browser without a session, a health probe
            assert (await client.get("/queues/")).status_code == 401
        assert (await client.get("/queues/", headers=bearer(TOKEN))).status_code == 200


async def test_wrong_logins_make_a_client_wait_like_wrong_bearer_tokens(
        app: App, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "crawlhub.api")
    async with app.client() as client:
        for i in range(FREE_FAILURES):
            r = await client.post("/login", content=f"token=guess-{i:012d}", headers=FORM)
            assert r.status_code == 401
        held = await client.post("/login", content=f"token={TOKEN}", headers=FORM)
        assert held.status_code == 429
        assert held.headers["Retry-After"] == "1" and "try again in 1 s" in held.text
        assert "set-cookie" not in held.headers
        # the login form and the bearer header share one count
        assert (await client.get("/queues/", headers=bearer(TOKEN))).status_code == 429
        app.clock.advance(1)
        ok = await client.post("/login", content=f"token={TOKEN}", headers=FORM)
        assert ok.status_code == 303 and "crawlhub_session" in ok.headers["set-cookie"]
    logins = [r.getMessage() for r in caplog.records if "wrong login" in r.getMessage()]
    assert len(logins) == FREE_FAILURES
    assert not any(TOKEN in r.getMessage() for r in caplog.records)


async def test_a_client_is_forgiven_after_a_quiet_quarter_hour(app: App) -> None:
    async with app.client() as client:
        for i in range(FREE_FAILURES + 4):  # slow enough to be counted each time
            app.clock.advance(60)
            r = await client.get("/queues/", headers=bearer(f"guess-{i:012d}"))
            assert r.status_code == 401
        assert (await client.get("/queues/", headers=bearer(TOKEN))).status_code == 429
        app.clock.advance(15 * 60)
        assert (await client.get("/queues/", headers=bearer(TOKEN))).status_code == 200
        # and starts over with its free tries
        assert (await client.get("/queues/", headers=bearer("guess-after-00000"))
                ).status_code == 401
        assert (await client.get("/queues/", headers=bearer(TOKEN))).status_code == 200


async def test_addresses_of_one_ipv6_64_count_as_one_client(app: App) -> None:
    """One host holds a whole /64: a new address for every guess gains nothing."""
    for i in range(FREE_FAILURES):
        async with app.client(f"2001:db8:1:2::{i + 1:x}") as client:
            assert (await client.get("/queues/", headers=bearer(f"guess-{i:012d}"))
                    ).status_code == 401
    async with app.client("2001:db8:1:2:ffff::9") as client:
        assert (await client.get("/queues/", headers=bearer(TOKEN))).status_code == 429
    async with app.client("2001:db8:1:3::1") as neighbour:  # the next /64
        assert (await neighbour.get("/queues/", headers=bearer(TOKEN))).status_code == 200

"""Alert routes are not a way into the server's network: the test button answers the
target's status and time, never its body; a webhook host in a denied network (link-local
and cloud metadata by default) or outside ``control.alert_allowed_hosts`` is refused when
the route is stored and again at every delivery, after resolving its name then."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.control.alerts import TargetPolicy
from tests.api import conftest as api_fixtures
from tests.api.conftest import Api, MakeApi

make_config = api_fixtures.make_config
make_api = api_fixtures.make_api

#: what an internal service answers; no API answer may carry it
INTERNAL = "ami-id instance-id iam/security-credentials/admin AKIA-INTERNAL-7Q2"


@pytest.fixture
def backend() -> str:
    return "sqlite"  # the routes live in the control DB, whatever the queues' backend


class Internal:
    """An HTTP service on 127.0.0.1 answering ``status`` with :data:`INTERNAL`."""

    def __init__(self) -> None:
        self.status = 200
        self.hits = 0
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def start(self) -> Internal:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = int(self.runner.addresses[0][1])
        return self

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.hits += 1
        return web.Response(status=self.status, text=INTERNAL,
                            reason="Reason " + INTERNAL[:20])


@pytest.fixture
async def internal() -> AsyncIterator[Internal]:
    server = await Internal().start()
    yield server
    assert server.runner is not None
    await server.runner.cleanup()


async def route(api: Api, url: str, name: str = "probe") -> int:
    r = await api.client.post("/alerts/", json={"name": name, "kind": "webhook", "url": url})
    return r.status_code


# ------------------------------------------------------------------------ answers
async def test_the_test_button_answers_the_status_and_time_never_the_body(
        make_api: MakeApi, internal: Internal) -> None:
    api = await make_api(control={"alert_timeout": 2})
    url = f"http://127.0.0.1:{internal.port}/latest/meta-data/"
    assert await route(api, url) == 201  # loopback stays allowed by default
    for status in (200, 500, 404):
        internal.status = status
        r = await api.client.post("/alerts/probe/test")
        assert r.status_code == 200 and r.json()["answer"] == f"HTTP {status}", r.text
        assert r.json()["ok"] is (status == 200) and r.json()["elapsed"] >= 0
        assert INTERNAL[:12] not in r.text and "Reason" not in r.text
    deliveries = await api.client.get("/alerts/deliveries")
    assert len(deliveries.json()) == 3 and INTERNAL[:12] not in deliveries.text
    assert internal.hits == 3


async def test_deliveries_recorded_with_a_body_by_an_older_server_answer_the_status_only(
        make_api: MakeApi) -> None:
    api = await make_api()
    assert api.svc.control is not None
    alerts = api.svc.control.alerts
    db = alerts.db
    for n, (answer, error) in enumerate([(f"HTTP 200 {INTERNAL}", ""),
                                         ("", f"the webhook answered HTTP 500 {INTERNAL}")]):
        await db.execute(
            f"INSERT INTO {db.table('alert_deliveries')} (id, route, event, job, run, about,"
            " subject, status, attempts, answer, error, ts) VALUES ($1, 'probe', 'test',"
            " NULL, NULL, 'route:probe', 'test', 'sent', 1, $2, $3, $4)",
            f"old-{n}", answer, error, 1_700_000_000.0 + n)
    r = await api.client.get("/alerts/deliveries")
    assert r.status_code == 200 and INTERNAL[:12] not in r.text, r.text
    assert [(d["answer"], d["error"]) for d in r.json()] == [
        ("", "the webhook answered HTTP 500"), ("HTTP 200", "")]


# ------------------------------------------------------------------------ when stored
@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://169.254.1.1:8080/",
    "http://[fe80::1]/hook",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/",
    "http://100.100.100.200/latest/meta-data/",
    "https://169.254.169.254./",
    "http://2852039166/",                  # 169.254.169.254 as one number
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://169.254.43518/",
])
async def test_a_link_local_or_metadata_target_is_refused_when_stored(
        make_api: MakeApi, url: str) -> None:
    api = await make_api()
    r = await api.client.post("/alerts/", json={"name": "meta", "kind": "webhook",
                                                "url": url})
    assert r.status_code == 422, r.text
    assert "denied network" in r.json()["detail"]
    assert "control.alert_denied_networks" in r.json()["detail"]
    assert (await api.client.get("/alerts/")).json() == []
    r = await api.client.post("/alerts/", json={"name": "ok", "kind": "email",
                                                "to": ["ops@example.com"]})
    assert r.status_code == 201
    r = await api.client.patch("/alerts/ok", json={"kind": "webhook", "url": url})
    assert r.status_code == 422 and "denied network" in r.json()["detail"], r.text


async def test_with_allowed_hosts_set_only_those_hosts_are_taken(
        make_api: MakeApi, internal: Internal) -> None:
    api = await make_api(control={"alert_allowed_hosts": ["hooks.slack.com",
                                                          "*.chat.example.com"]})
    for url in (f"http://127.0.0.1:{internal.port}/", f"http://localhost:{internal.port}/",
                "https://hooks.slack.com.evil.example/x", "https://chat.example.com/x"):
        r = await api.client.post("/alerts/", json={"name": "x", "kind": "webhook",
                                                    "url": url})
        assert r.status_code == 422, (url, r.text)
        assert "control.alert_allowed_hosts" in r.json()["detail"]
    listed = await make_api(control={"alert_allowed_hosts": ["127.0.0.1"]})
    assert await route(listed, f"http://127.0.0.1:{internal.port}/hook") == 201
    r = await listed.client.post("/alerts/probe/test")
    assert r.json()["ok"] is True and internal.hits == 1


def test_the_policy_reads_wildcards_addresses_and_mapped_addresses() -> None:
    policy = TargetPolicy.of(["*.example.com", "10.0.0.5", "Hooks.Slack.com."])
    assert policy.host_problem("a.b.example.com") is None
    assert policy.host_problem("hooks.slack.com") is None
    assert policy.host_problem("example.com") is not None  # only names below it
    assert policy.host_problem("badexample.com") is not None
    assert policy.host_problem("10.0.0.5") is None
    assert policy.host_problem("10.0.0.6") is not None
    denied = TargetPolicy.of(denied_networks=["10.0.0.0/8"])
    assert denied.host_problem("::ffff:10.1.2.3") is not None
    assert denied.host_problem("169.254.169.254") is None  # the list replaces the defaults
    assert TargetPolicy().host_problem("fe80::1%eth0") is not None


def test_a_denied_network_that_is_not_one_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="not an IP network"):
        CrawlhubConfig.model_validate({"control": {"alert_denied_networks": ["metadata"]}})


# ------------------------------------------------------------------------ when sent
async def test_the_policy_is_applied_again_when_sending_after_resolving_the_name(
        make_api: MakeApi, internal: Internal) -> None:
    """Routes stored while loopback was allowed (or while a name pointed elsewhere: DNS
    can change after the check) are refused at delivery by the server's policy now."""
    before = await make_api(control={"alert_timeout": 2})
    assert await route(before, f"http://localhost:{internal.port}/hook", "by-name") == 201
    assert await route(before, f"http://127.0.0.1:{internal.port}/hook", "literal") == 201
    # the same control database, opened by a server that denies loopback
    after = await make_api(control={"alert_timeout": 2, "alert_denied_networks": [
        "127.0.0.0/8", "::1/128", "169.254.0.0/16"]})
    assert await route(before, f"http://2130706433:{internal.port}/hook", "number") == 201
    for name in ("by-name", "literal", "number"):
        r = await after.client.post(f"/alerts/{name}/test")
        assert r.status_code == 200 and r.json()["ok"] is False, r.text
        assert r.json()["answer"] == ""
        if name != "number":  # aiohttp refuses a non-canonical address itself
            assert "denied network" in r.json()["error"], r.text
    assert internal.hits == 0
    # and stored now, the name is resolved and refused at once
    r = await after.client.post("/alerts/", json={
        "name": "again", "kind": "webhook", "url": f"http://localhost:{internal.port}/"})
    assert r.status_code == 422 and "denied network" in r.json()["detail"], r.text

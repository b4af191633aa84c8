"""Hostile web pages against a no-token server on 127.0.0.1: a DNS-rebinding page (its own
name in ``Host``), cross-site posts (``Origin``, ``Sec-Fetch-Site``) and bodies a form can
send are refused before anything runs; the CLI, scripts, the web page's own requests and
signed webhooks still pass."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from crawlhub.app.asgi import create_app
from crawlhub.services import Services

from .http_live import config, live, raw_request

JSON = {"Content-Type": "application/json"}
#: What the server's own page sends from http://127.0.0.1:8526 (the client's base URL).
OWN = "http://127.0.0.1:8526"


def marker_job(name: str, marker: Path) -> dict[str, Any]:
    """A job whose run leaves ``marker`` behind: proof that it ran."""
    return {"name": name,
            "command": [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"]}


@dataclass
class App:
    client: httpx2.AsyncClient
    svc: Services
    marker: Path

    async def runs(self, job: str = "marker") -> list[Any]:
        r = await self.client.get("/runs/", params={"job": job})
        assert r.status_code == 200, r.text
        return list(r.json())

    async def jobs(self) -> list[str]:
        return [j["name"] for j in (await self.client.get("/jobs/")).json()]


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    """A no-token app on SQLite with one job, ``marker``; the client is a script (no
    Origin, no Sec-Fetch-*), at ``Host: 127.0.0.1:8526``."""
    svc = await Services.open(config(tmp_path, allowed_hosts=["crawlhub.example.com",
                                                              ".corp.example"]))
    await svc.start()
    marker = tmp_path / "ran"
    try:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=create_app(services=svc)),
                                      base_url=OWN) as client:
            made = await client.post("/jobs/", json=marker_job("marker", marker))
            assert made.status_code == 201, made.text
            yield App(client, svc, marker)
    finally:
        await svc.close()


# ---------------------------------------------------------------------------- Host
@pytest.mark.parametrize("host", ["rebind.evil.example", "rebind.evil.example:8526",
                                  "127.0.0.1.evil.example", "localhost.evil.example:8526",
                                  "crawlhub.example.com.evil.example", "corp.example.evil"])
async def test_a_request_naming_a_host_not_ours_is_refused_before_anything_runs(
        app: App, host: str) -> None:
    evil = marker_job("evil", app.marker)
    created = await app.client.post("/jobs/", json=evil, headers={"Host": host})
    assert created.status_code == 421, created.text
    assert "server.allowed_hosts" in created.json()["detail"]
    run = await app.client.post("/jobs/marker/run", headers={"Host": host})
    assert run.status_code == 421
    read = await app.client.get("/jobs/", headers={"Host": host})  # nor read an answer
    assert read.status_code == 421 and "marker" not in read.text
    assert await app.jobs() == ["marker"]
    assert await app.runs() == []


@pytest.mark.parametrize("host", ["127.0.0.1:8526", "localhost:8526", "LOCALHOST", "[::1]:8526",
                                  "127.0.0.2", "crawlhub.example.com", "ci.corp.example:443"])
async def test_loopback_names_and_allowed_hosts_are_answered(app: App, host: str) -> None:
    r = await app.client.get("/jobs/", headers={"Host": host})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------- Origin
FOREIGN = [
    {"Origin": "http://127.0.0.1:9999"},     # another port of this machine: same site
    {"Origin": "http://localhost:8526"},     # the same port under another name
    {"Origin": "https://evil.example"},
    {"Origin": "null"},                      # a sandboxed frame, a file: page
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},         # another local origin, no Origin sent
    {"Origin": OWN, "Sec-Fetch-Site": "same-site"},
]


@pytest.mark.parametrize("headers", FOREIGN)
@pytest.mark.parametrize("action", ["run", "pause", "continue", "cancel", "restart"])
async def test_a_bodiless_post_from_another_origin_changes_nothing(
        app: App, headers: dict[str, str], action: str) -> None:
    r = await app.client.post(f"/jobs/marker/{action}", headers=headers)
    assert r.status_code == 403, r.text
    assert "another origin" in r.json()["detail"]
    assert await app.runs() == []


@pytest.mark.parametrize("headers", FOREIGN)
async def test_a_json_post_from_another_origin_creates_nothing(
        app: App, headers: dict[str, str]) -> None:
    r = await app.client.post("/jobs/", json=marker_job("evil", app.marker),
                              headers=headers)
    assert r.status_code == 403, r.text
    deleted = await app.client.delete("/jobs/marker", headers=headers)
    assert deleted.status_code == 403
    assert await app.jobs() == ["marker"]


# ---------------------------------------------------------------------------- bodies
@pytest.mark.parametrize("kind", ["text/plain", "text/plain;charset=UTF-8",
                                  "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x", None])
async def test_a_body_a_form_can_send_is_refused_even_without_an_origin(
        app: App, kind: str | None) -> None:
    """What a browser too old for Origin, or a no-cors fetch of a Blob, would send."""
    headers = {"Content-Type": kind} if kind else {}
    task = await app.client.post("/task/", content=b'{"url": "http://127.0.0.1/x"}',
                                 headers=headers)
    assert task.status_code == 415, task.text
    assert "application/json" in task.json()["detail"]
    assert await app.svc.queues.queue("default").length() == 0
    job = await app.client.post("/jobs/", content=b'{"name": "evil", "command": ["true"]}',
                                headers=headers)
    assert job.status_code == 415
    assert await app.jobs() == ["marker"]


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded"])
async def test_an_empty_post_of_a_script_needs_no_type_but_one_from_a_page_is_refused(
        app: App, kind: str) -> None:
    """urllib's ``data=b""`` says it is a form; a browser's empty form post says where it
    comes from."""
    foreign = await app.client.post("/jobs/marker/pause", content=b"", headers={
        "Content-Type": kind, "Origin": "http://127.0.0.1:9999"})
    assert foreign.status_code == 403
    script = await app.client.post("/jobs/marker/pause", content=b"",
                                   headers={"Content-Type": kind})
    assert script.status_code == 200, script.text


async def test_json_routes_want_a_json_type_even_from_our_own_page(app: App) -> None:
    # HX-Request passes the form rule; the JSON reader still wants JSON
    r = await app.client.post("/task/", content=b'{"url": "x"}',
                              headers={"HX-Request": "true", "Content-Type": "text/plain",
                                       "Origin": OWN})
    assert r.status_code == 415
    assert await app.svc.queues.queue("default").length() == 0


# ---------------------------------------------------------------------------- friends
async def test_scripts_the_cli_and_the_servers_own_page_still_pass(app: App) -> None:
    script = await app.client.post("/task/", json={"url": "http://127.0.0.1/a"})
    assert script.status_code == 200, script.text
    page = await app.client.post("/task/", json={"url": "http://127.0.0.1/b"}, headers={
        "Origin": OWN, "Sec-Fetch-Site": "same-origin", "HX-Request": "true"})
    assert page.status_code == 200, page.text
    typed = await app.client.post("/task/", content=b'{"url": "http://127.0.0.1/c"}',
                                  headers={"Content-Type": "application/merge-patch+json"})
    assert typed.status_code == 200, typed.text
    curl = await app.client.post("/jobs/marker/pause")  # curl -X POST: no body, no type
    assert curl.status_code == 200, curl.text
    named = await app.client.post("/task/", json={"url": "http://127.0.0.1/d"}, headers={
        "Host": "crawlhub.example.com", "Origin": "https://crawlhub.example.com"})
    assert named.status_code == 200, named.text
    # a proxy that passes Host: 127.0.0.1:8526 on: the page's origin is a listed name
    proxied = await app.client.post("/task/", json={"url": "http://127.0.0.1/e"}, headers={
        "Origin": "https://crawlhub.example.com", "Sec-Fetch-Site": "same-origin"})
    assert proxied.status_code == 200, proxied.text
    assert await app.svc.queues.queue("default").length() == 5


async def test_webhooks_may_come_from_anywhere_but_not_under_a_foreign_host(app: App) -> None:
    """A forge posts cross-site (form-encoded on GitHub) and is checked by its signature;
    the Host rule still holds for it."""
    forge = {"Origin": "https://github.com", "Sec-Fetch-Site": "cross-site",
             "Content-Type": "application/x-www-form-urlencoded", "X-GitHub-Event": "push"}
    r = await app.client.post("/hooks/demo", content=b"payload=%7B%7D", headers=forge)
    assert r.status_code not in (403, 415, 421), r.text  # the hook's own answer
    rebound = await app.client.post("/hooks/demo", content=b"payload=%7B%7D",
                                    headers={**forge, "Host": "rebind.evil.example"})
    assert rebound.status_code == 421


# ---------------------------------------------------------------------------- real socket
def test_over_a_real_socket_a_rebinding_host_is_refused_and_the_socket_address_is_not(
        tmp_path: Path) -> None:
    with live(config(tmp_path)) as (url, _):
        port = url.rsplit(":", 1)[1]
        body = b'{"url": "http://127.0.0.1/x"}'

        def post(host: str) -> bytes:
            return raw_request(url, f"POST /task/ HTTP/1.1\r\nHost: {host}\r\nContent-Type:"
                               f" application/json\r\nContent-Length: {len(body)}\r\n"
                               "Connection: close\r\n\r\n".encode() + body)

        assert post(f"rebind.evil.example:{port}").startswith(b"HTTP/1.1 421 ")
        assert post(f"127.0.0.1:{port}").startswith(b"HTTP/1.1 200 ")
        assert post(f"localhost:{port}").startswith(b"HTTP/1.1 200 ")

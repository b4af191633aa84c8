"""``/projects/``, ``/hooks/{project}`` and ``/builds/`` on the real app: webhooks signed
exactly as GitHub, Gitea and GitLab sign them build the release tag from a local bare
repository; anything unsigned or badly signed is 401 and runs nothing; the password and
the webhook secret never appear in an answer or a log line."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx2
import pytest

from crawlhub.services import Services
from tests.api.conftest import MakeApi
from tests.control.gitremote import Remote, make_remote

PASSWORD = "pw-Kx9-hidden-always"
SECRET = "whsec-aa81-bb72-cc63"
TOKEN = "api-token-5f1e-9c2d"


class App:
    def __init__(self, svc: Services, client: httpx2.AsyncClient, remote: Remote) -> None:
        self.svc = svc
        self.client = client
        self.remote = remote

    async def add(self, name: str = "demo", **fields: Any) -> httpx2.Response:
        body = {"name": name, "git_url": self.remote.url, "username": "ci",
                "password": PASSWORD, "webhook_secret": SECRET, **fields}
        return await self.client.post("/projects/", json=body)

    async def build_rows(self) -> int:
        assert self.svc.control is not None
        return len(await self.svc.control.builds.list())

    async def finished(self, build_id: int) -> dict[str, Any]:
        for _ in range(400):
            r = await self.client.get(f"/builds/{build_id}")
            if r.json()["status"] in ("succeeded", "failed"):
                return dict(r.json())
            await asyncio.sleep(0.05)
        raise AssertionError(f"build {build_id} did not finish")


MakeApp = Callable[..., Awaitable[App]]


@pytest.fixture
def backend() -> str:
    """Projects and builds live in the control DB (SQLite here either way): the queues'
    backend does not matter."""
    return "sqlite"


@pytest.fixture
def make_app(make_api: MakeApi, tmp_path: Path) -> MakeApp:
    """``await make_app(token=...)``: the app of ``make_api`` and a local git remote."""
    remote = make_remote(tmp_path / "git")

    async def make(*, token: str | None = None, headers: dict[str, str] | None = None) -> App:
        api = await make_api(headers=headers, server={"token": token} if token else {})
        return App(api.svc, api.client, remote)

    return make


@pytest.fixture
async def api(make_app: MakeApp) -> App:
    return await make_app()


def tag_push(tag: str = "release/demo/1.0", commit: str = "a" * 40, **extra: Any) -> bytes:
    return json.dumps({"ref": f"refs/tags/{tag}", "before": "0" * 40, "after": commit,
                       "created": True, "deleted": False,
                       "repository": {"clone_url": "http://127.0.0.1:3000/team/demo.git"},
                       **extra}).encode()


def github(body: bytes, secret: str = SECRET, event: str = "push") -> dict[str, str]:
    sig = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": f"sha256={sig}", "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/044aadd"}


def gitea(body: bytes, secret: str = SECRET, event: str = "push") -> dict[str, str]:
    sig = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Gitea-Event": event, "X-Gitea-Delivery": str(uuid.uuid4()),
            "X-Gitea-Signature": sig,
            "X-Gogs-Event": event, "X-GitHub-Event": event, "X-Hub-Signature-256":
            f"sha256={sig}", "Content-Type": "application/json"}


def gitlab(body: bytes, secret: str = SECRET, event: str = "Tag Push Hook") -> dict[str, str]:
    return {"X-Gitlab-Event": event, "X-Gitlab-Token": secret,
            "Content-Type": "application/json"}


def gitlab_tag_push(tag: str = "release/demo/1.0", commit: str = "b" * 40) -> bytes:
    return json.dumps({"object_kind": "tag_push", "ref": f"refs/tags/{tag}",
                       "before": "0" * 40, "after": commit, "checkout_sha": commit,
                       "project": {"git_http_url": "http://127.0.0.1/team/demo.git"}}).encode()


# ---------------------------------------------------------------------------- projects
async def test_projects_are_added_read_changed_and_removed_without_showing_secrets(
        api: App, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    r = await api.add()
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["has_password"] and body["has_webhook_secret"]
    assert "password" not in body and "webhook_secret" not in body
    assert body["hook_path"] == "/hooks/demo"
    answers = [r.text]
    assert (await api.add()).status_code == 409
    r = await api.client.get("/projects/demo")
    assert r.status_code == 200 and r.json()["username"] == "ci"
    answers.append(r.text)
    r = await api.client.get("/projects/")
    assert [p["name"] for p in r.json()["projects"]] == ["demo"] and r.json()["next"] is None
    answers.append(r.text)
    r = await api.client.patch("/projects/demo", json={"password": None,
                                                       "default_branch": "develop"})
    assert r.status_code == 200 and not r.json()["has_password"]
    assert r.json()["default_branch"] == "develop" and r.json()["has_webhook_secret"]
    answers.append(r.text)
    assert (await api.client.delete("/projects/demo")).status_code == 204
    assert (await api.client.get("/projects/demo")).status_code == 404
    assert (await api.client.delete("/projects/demo")).status_code == 404
    for text in [*answers, caplog.text]:
        assert PASSWORD not in text and SECRET not in text


async def test_projects_are_paged_by_name(api: App) -> None:
    for name in ("c", "a", "b"):
        assert (await api.add(name)).status_code == 201
    first = (await api.client.get("/projects/?limit=2")).json()
    assert [p["name"] for p in first["projects"]] == ["a", "b"] and first["next"] == "b"
    rest = (await api.client.get(f"/projects/?limit=2&after={first['next']}")).json()
    assert [p["name"] for p in rest["projects"]] == ["c"] and rest["next"] is None


@pytest.mark.parametrize("fields, why", [
    ({"name": "../etc"}, "name"),
    ({"name": "a" * 65}, "name"),
    ({"git_url": "ext::sh"}, "transport helper"),
    ({"git_url": "--upload-pack=touch"}, "option"),
    ({"git_url": f"https://ci:{PASSWORD}@git.example.com/x.git"}, "holds a password"),
    ({"tag_pattern": "{Release}:{Name}:{Version}"}, "git forbids ':'"),
    ({"builder": {"name": "shell"}}, "unknown builder"),
    ({"webhook_secret": "short"}, "at least 8"),
    ({"extra": 1}, "extra"),
])
async def test_bad_projects_are_refused_with_why_and_never_echo_a_password(
        api: App, fields: dict[str, Any], why: str) -> None:
    r = await api.add(**fields)
    assert r.status_code == 422, r.text
    assert why in r.text and PASSWORD not in r.text
    assert (await api.client.get("/projects/")).json()["projects"] == []


async def test_unknown_or_hostile_project_paths_are_not_found(api: App) -> None:
    for path in ("/projects/nope", "/projects/..%2Fetc", "/projects/%2e%2e"):
        r = await api.client.get(path)
        assert r.status_code in (404, 422), (path, r.text)
    assert (await api.client.get("/builds/999")).status_code == 404
    assert (await api.client.get("/builds/0")).status_code == 422
    assert (await api.client.get("/builds/?status=done")).status_code == 422


# ---------------------------------------------------------------------------- hooks
@pytest.mark.parametrize("forge", ["github", "gitea", "gitlab"])
async def test_a_signed_release_tag_push_builds_it_and_records_the_artifact(
        api: App, forge: str) -> None:
    assert (await api.add()).status_code == 201
    body = gitlab_tag_push() if forge == "gitlab" else tag_push()
    headers = {"github": github, "gitea": gitea, "gitlab": gitlab}[forge](body)
    r = await api.client.post("/hooks/demo", content=body, headers=headers)
    assert r.status_code == 202, r.text
    answer = r.json()
    assert answer["forge"] == forge and answer["version"] == "1.0"
    assert answer["tag"] == "release/demo/1.0" and answer["ignored"] is None
    build = await api.finished(answer["build"])
    assert build["status"] == "succeeded", build["log"]
    assert build["trigger"] == "hook" and build["version"] == "1.0"
    assert build["commit"] == api.remote.commits["release/demo/1.0"]
    assert build["artifact_kind"] == "venv" and "cloned release/demo/1.0" in build["log"]
    r = await api.client.get("/projects/demo/artifact?version=1.0")
    assert r.status_code == 200 and r.json()["path"] == build["artifact_path"]
    assert r.json()["build"] == build["id"]
    log = await api.client.get(f"/builds/{build['id']}/log")
    assert log.headers["content-type"].startswith("text/plain") and log.text == build["log"]
    assert PASSWORD not in log.text


async def test_a_github_hook_sent_form_encoded_is_read_too(api: App) -> None:
    assert (await api.add()).status_code == 201
    body = urlencode({"payload": tag_push().decode()}).encode()
    headers = {**github(body), "Content-Type": "application/x-www-form-urlencoded"}
    r = await api.client.post("/hooks/demo", content=body, headers=headers)
    assert r.status_code == 202 and r.json()["build"], r.text
    await api.finished(r.json()["build"])


@pytest.mark.parametrize("headers", [
    {"X-GitHub-Event": "push", "Content-Type": "application/json"},
    {**github(tag_push(), secret="wrong-secret-123")},
    {**github(tag_push()), "X-Hub-Signature-256": "sha256=" + "0" * 64},
    {**github(tag_push()), "X-Hub-Signature-256": "sha1=abc"},
    {**gitea(tag_push(), secret="wrong-secret-123"), "X-Hub-Signature-256": ""},
    {"X-Gitea-Event": "push", "Content-Type": "application/json"},
    gitlab(tag_push(), secret="wrong-secret-123"),
    {"X-Gitlab-Event": "Tag Push Hook"},
    {"Content-Type": "application/json"},
], ids=["unsigned", "github-other-secret", "github-bad-hex", "sha1", "gitea-other-secret",
        "gitea-unsigned", "gitlab-wrong-token", "gitlab-no-token", "no-forge"])
async def test_unsigned_or_badly_signed_hooks_are_401_and_build_nothing(
        api: App, headers: dict[str, str]) -> None:
    assert (await api.add()).status_code == 201
    r = await api.client.post("/hooks/demo", content=tag_push(), headers=headers)
    assert r.status_code == 401, r.text
    assert await api.build_rows() == 0


async def test_a_hook_cannot_tell_an_unknown_project_from_a_bad_signature(api: App) -> None:
    assert (await api.add()).status_code == 201
    assert (await api.add("nosecret", webhook_secret=None)).status_code == 201
    body = tag_push()
    answers = []
    for project in ("demo", "nope", "nosecret", "a%20b", "x" * 150):
        r = await api.client.post(f"/hooks/{project}", content=body,
                                  headers=github(body, secret="guess-secret-1"))
        answers.append((r.status_code, r.json()["detail"]))
    assert len(set(answers)) == 1 and answers[0][0] == 401
    # a path that is not one segment matches no route at all
    r = await api.client.post("/hooks/..%2F..%2Fetc", content=body, headers=github(body))
    assert r.status_code == 404 and "no such endpoint" in r.json()["detail"]
    # a project without a webhook secret refuses even a hook signed with an empty key
    r = await api.client.post("/hooks/nosecret", content=body, headers=github(body, secret=""))
    assert r.status_code == 401
    assert await api.build_rows() == 0


@pytest.mark.parametrize("body, why", [
    (json.dumps({"ref": "refs/heads/main", "after": "c" * 40}).encode(), "not a tag"),
    (tag_push("v1.0"), "does not match the pattern"),
    (tag_push("release/other/1.0"), "release of 'other'"),
    (tag_push(commit="0" * 40, deleted=True), "was deleted"),
])
async def test_pushes_that_are_not_this_projects_release_are_ignored(
        api: App, body: bytes, why: str) -> None:
    assert (await api.add()).status_code == 201
    r = await api.client.post("/hooks/demo", content=body, headers=github(body))
    assert r.status_code == 202 and why in r.json()["ignored"], r.text
    assert r.json()["build"] is None and await api.build_rows() == 0


async def test_a_ping_is_answered_and_builds_nothing(api: App) -> None:
    assert (await api.add()).status_code == 201
    body = json.dumps({"zen": "Keep it logically awesome.", "hook_id": 1}).encode()
    r = await api.client.post("/hooks/demo", content=body, headers=github(body, event="ping"))
    assert r.status_code == 200 and "not a push" in r.json()["ignored"]
    assert await api.build_rows() == 0


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"ref": 5}'])
async def test_a_signed_payload_that_is_not_a_push_is_400(api: App, body: bytes) -> None:
    assert (await api.add()).status_code == 201
    r = await api.client.post("/hooks/demo", content=body, headers=github(body))
    assert r.status_code == 400, r.text
    assert await api.build_rows() == 0


async def test_a_huge_hook_body_is_refused_before_anything_is_read(api: App) -> None:
    assert (await api.add()).status_code == 201
    body = b'{"ref": "refs/tags/release/demo/1.0", "pad": "' + b"x" * (6 * 2**20) + b'"}'
    r = await api.client.post("/hooks/demo", content=body, headers=github(body))
    assert r.status_code == 413
    assert await api.build_rows() == 0


async def test_a_hook_while_that_version_builds_is_a_conflict(api: App) -> None:
    import sys

    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    assert (await api.add(builder={"name": "command", "options": {"argv": sleep}})
            ).status_code == 201
    body = tag_push()
    first = await api.client.post("/hooks/demo", content=body, headers=github(body))
    assert first.status_code == 202 and first.json()["build"]
    body = tag_push(pusher={"name": "another push of the tag"})  # the same body: duplicate
    again = await api.client.post("/hooks/demo", content=body, headers=github(body))
    assert again.status_code == 409 and "one build per project" in again.json()["detail"]
    r = await api.client.delete("/projects/demo")
    assert r.status_code == 409


async def test_with_a_token_set_a_signed_hook_needs_no_bearer_and_the_rest_does(
        make_app: MakeApp) -> None:
    api = await make_app(token=TOKEN, headers={"Authorization": f"Bearer {TOKEN}"})
    assert (await api.add()).status_code == 201
    anonymous = httpx2.AsyncClient(transport=api.client._transport,  # the same app
                                   base_url="http://crawlhub.test")
    try:
        assert (await anonymous.get("/projects/")).status_code == 401
        assert (await anonymous.get("/builds/")).status_code == 401
        body = tag_push()
        unsigned = await anonymous.post("/hooks/demo", content=body,
                                        headers={"X-GitHub-Event": "push"})
        assert unsigned.status_code == 401 and "webhook refused" in unsigned.json()["detail"]
        assert await api.build_rows() == 0
        signed = await anonymous.post("/hooks/demo", content=body, headers=github(body))
        assert signed.status_code == 202 and signed.json()["build"], signed.text
        assert (await api.finished(signed.json()["build"]))["status"] == "succeeded"
    finally:
        await anonymous.aclose()


# ---------------------------------------------------------------------------- builds
async def test_builds_are_started_listed_and_read_through_the_api(api: App) -> None:
    assert (await api.add()).status_code == 201
    r = await api.client.post("/projects/demo/builds", json={"tag": "release/demo/1.0"})
    assert r.status_code == 202 and r.json()["version"] == "1.0", r.text
    first = await api.finished(r.json()["id"])
    r = await api.client.post("/projects/demo/builds", json={"ref": "main", "version": "dev"})
    assert r.status_code == 202 and r.json()["ref"] == "main"
    second = await api.finished(r.json()["id"])
    assert first["status"] == second["status"] == "succeeded"
    listed = (await api.client.get("/builds/?project=demo&limit=1")).json()
    assert [b["id"] for b in listed["builds"]] == [second["id"]]
    assert listed["builds"][0]["log"] is None and listed["next"] == second["id"]
    older = (await api.client.get(f"/builds/?before={listed['next']}")).json()
    assert [b["id"] for b in older["builds"]] == [first["id"]]
    assert (await api.client.get("/builds/?status=failed")).json()["builds"] == []
    latest = (await api.client.get("/projects/demo/artifact")).json()
    # the highest version, not the last build: the release, not the branch build 'dev'
    assert latest["version"] == "1.0" and latest["build"] == first["id"]
    assert (await api.client.get("/projects/demo/artifact?version=9")).status_code == 404


@pytest.mark.parametrize("body, status", [
    ({"tag": "v1"}, 422),
    ({"ref": "main"}, 422),
    ({"tag": "release/demo/1.0", "ref": "main"}, 422),
    ({"ref": "--upload-pack=x", "version": "1"}, 422),
    ({"ref": "main", "version": "../../x"}, 422),
])
async def test_bad_build_requests_are_refused(api: App, body: dict[str, str],
                                              status: int) -> None:
    assert (await api.add()).status_code == 201
    r = await api.client.post("/projects/demo/builds", json=body)
    assert r.status_code == status, r.text
    assert await api.build_rows() == 0
    r = await api.client.post("/projects/nope/builds", json={"tag": "release/nope/1"})
    assert r.status_code == 404

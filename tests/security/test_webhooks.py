"""Hostile webhooks: a signed push replayed (the same delivery again, or the same signed
body under a new delivery id) builds once; an old release tag replayed never moves
``latest`` back; a signed body nested too deep is a 400 with a JSON answer, not a 500."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import pytest

from crawlhub.control.db import ControlDB
from tests.api import conftest as api_fixtures
from tests.api import test_projects_api as projects_api
from tests.api.test_projects_api import App, gitea, github, gitlab, gitlab_tag_push, tag_push
from tests.control import conftest as control_fixtures
from tests.helpers import FakeClock

# the fixtures of the projects API tests: the app over SQLite, with a local git remote
make_config = api_fixtures.make_config
make_api = api_fixtures.make_api
backend = projects_api.backend
make_app = projects_api.make_app
api = projects_api.api
control_db = control_fixtures.control_db


def signed(forge: str, body: bytes, delivery: str) -> dict[str, str]:
    """The headers ``forge`` sends with ``body`` as delivery ``delivery``."""
    if forge == "github":
        return {**github(body), "X-GitHub-Delivery": delivery}
    if forge == "gitea":
        return {**gitea(body), "X-Gitea-Delivery": delivery, "X-GitHub-Delivery": delivery}
    return {**gitlab(body), "X-Gitlab-Event-UUID": delivery}


def push(forge: str, tag: str = "release/demo/1.0", **extra: Any) -> bytes:
    if forge == "gitlab":
        return gitlab_tag_push(tag)[:-1] + b"".join(
            f', "{k}": {json.dumps(v)}'.encode() for k, v in extra.items()) + b"}"
    return tag_push(tag, **extra)


# ------------------------------------------------------------------------ replayed pushes
@pytest.mark.parametrize("forge", ["github", "gitea", "gitlab"])
async def test_a_redelivered_push_builds_once_and_is_answered_duplicate(
        api: App, forge: str) -> None:
    assert (await api.add()).status_code == 201
    body, delivery = push(forge), str(uuid.uuid4())
    first = await api.client.post("/hooks/demo", content=body,
                                  headers=signed(forge, body, delivery))
    assert first.status_code == 202 and first.json()["build"], first.text
    assert first.json()["status"] == "building"
    for _ in range(2):
        again = await api.client.post("/hooks/demo", content=body,
                                      headers=signed(forge, body, delivery))
        # 200, not an error: a forge retries failed deliveries, and this one succeeded
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "duplicate" and again.json()["build"] is None
        assert delivery in again.json()["ignored"]
    assert await api.build_rows() == 1
    await api.finished(first.json()["build"])


async def test_copies_of_a_delivery_arriving_together_build_once(api: App) -> None:
    assert (await api.add()).status_code == 201
    body = tag_push()
    headers = signed("github", body, str(uuid.uuid4()))
    answers = await asyncio.gather(*(api.client.post("/hooks/demo", content=body,
                                                     headers=headers) for _ in range(5)))
    assert sorted(r.status_code for r in answers) == [200, 200, 200, 200, 202]
    assert sorted(r.json()["status"] for r in answers) == ["building"] + ["duplicate"] * 4
    assert await api.build_rows() == 1
    await api.finished(next(r.json()["build"] for r in answers if r.status_code == 202))


async def test_the_same_signed_body_under_a_new_delivery_id_is_a_duplicate_too(
        api: App) -> None:
    """The delivery header is not signed: whoever captured a signed body can send it
    with any id. The body's digest is remembered beside the id."""
    assert (await api.add()).status_code == 201
    body = tag_push()
    first = await api.client.post("/hooks/demo", content=body,
                                  headers=signed("github", body, str(uuid.uuid4())))
    assert first.status_code == 202 and first.json()["build"], first.text
    forged = {**signed("github", body, str(uuid.uuid4()))}
    again = await api.client.post("/hooks/demo", content=body, headers=forged)
    assert again.status_code == 200 and again.json()["status"] == "duplicate", again.text
    del forged["X-GitHub-Delivery"]
    again = await api.client.post("/hooks/demo", content=body, headers=forged)
    assert again.status_code == 200 and again.json()["status"] == "duplicate", again.text
    assert await api.build_rows() == 1
    await api.finished(first.json()["build"])


async def test_a_delivery_that_failed_is_not_remembered_so_the_forge_may_retry_it(
        api: App) -> None:
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    assert (await api.add(builder={"name": "command", "options": {"argv": sleep}})
            ).status_code == 201
    body = tag_push()
    first = await api.client.post("/hooks/demo", content=body,
                                  headers=signed("github", body, str(uuid.uuid4())))
    assert first.status_code == 202 and first.json()["build"], first.text
    # another push of the same version while it builds: 409, and so is its redelivery
    other, delivery = tag_push(pusher={"name": "b"}), str(uuid.uuid4())
    for _ in range(2):
        r = await api.client.post("/hooks/demo", content=other,
                                  headers=signed("github", other, delivery))
        assert r.status_code == 409 and "one build per project" in r.json()["detail"], r.text
    assert await api.build_rows() == 1


async def test_deliveries_are_remembered_for_a_day_then_pruned(
        control_db: ControlDB) -> None:
    from crawlhub.control.hooks import DELIVERY_KEEP, DeliveryLog, delivery_keys

    clock = FakeClock()
    log = DeliveryLog(control_db, clock=clock)
    await log.create_schema()
    keys = delivery_keys("github", {"X-GitHub-Delivery": "d-1"}, b"{}")
    assert len(keys) == 2  # the id and the body's digest
    claim = await log.claim("demo", keys)
    assert claim is not None
    assert await log.claim("demo", keys) is None
    assert await log.claim("other", keys) is not None  # per project
    clock.advance(DELIVERY_KEEP - 1)
    assert await log.claim("demo", keys) is None
    assert await log.claim("demo", delivery_keys("github", {"X-GitHub-Delivery": "d-1"},
                                                 b'{"a": 1}')) is None  # the same id
    clock.advance(2)
    assert await log.claim("demo", keys) is not None  # a day later: forgotten
    clock.advance(DELIVERY_KEEP + 1)
    await log.claim("demo", delivery_keys("github", {}, b"[]"))
    assert await log.count() == 1  # the rest pruned


async def test_a_released_claim_can_be_claimed_again(control_db: ControlDB) -> None:
    from crawlhub.control.hooks import DeliveryLog, delivery_keys

    log = DeliveryLog(control_db, clock=FakeClock())
    await log.create_schema()
    keys = delivery_keys("gitlab", {"X-Gitlab-Event-UUID": "e-1"}, b"{}")
    claim = await log.claim("demo", keys)
    assert claim is not None
    await log.release("demo", keys, claim)
    assert await log.claim("demo", keys) is not None


# ------------------------------------------------------------------------ downgrade
async def test_a_replayed_old_release_does_not_move_latest_back(api: App) -> None:
    assert (await api.add()).status_code == 201
    api.remote.commit({"job.py": "print('two')\n"}, "second")
    api.remote.tag("release/demo/2.0")
    for tag in ("release/demo/2.0", "release/demo/1.0"):  # 1.0 replayed after 2.0
        body = tag_push(tag)
        r = await api.client.post("/hooks/demo", content=body,
                                  headers=signed("github", body, str(uuid.uuid4())))
        assert r.status_code == 202 and r.json()["build"], r.text
        assert (await api.finished(r.json()["build"]))["status"] == "succeeded"
    r = await api.client.get("/projects/demo/artifact")
    assert r.status_code == 200 and r.json()["version"] == "2.0", r.text
    assert r.json()["commit"] == api.remote.commits["release/demo/2.0"]
    # a branch build of a version that is no release does not become latest either
    r = await api.client.post("/projects/demo/builds", json={"ref": "main",
                                                             "version": "nightly"})
    assert (await api.finished(r.json()["id"]))["status"] == "succeeded"
    r = await api.client.get("/projects/demo/artifact?version=latest")
    assert r.json()["version"] == "2.0"


# ------------------------------------------------------------------------ hostile bodies
@pytest.mark.parametrize("event", ["push", "ping"])
async def test_a_signed_body_nested_a_thousand_deep_is_a_400_with_a_json_answer(
        api: App, event: str) -> None:
    assert (await api.add()).status_code == 201
    body = b'{"ref": "refs/tags/release/demo/1.0", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    r = await api.client.post("/hooks/demo", content=body,
                              headers=github(body, event=event))
    assert r.status_code == 400, r.text
    assert "nested more than" in r.json()["detail"]
    assert await api.build_rows() == 0


async def test_a_signed_event_that_is_not_json_is_a_400(api: App) -> None:
    assert (await api.add()).status_code == 201
    body = b"zen=not json"
    r = await api.client.post("/hooks/demo", content=body, headers=github(body, event="ping"))
    assert r.status_code == 400 and "not JSON" in r.json()["detail"], r.text

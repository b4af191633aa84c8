"""Alert routes per job: real webhook and SMTP targets on 127.0.0.1, routing by event,
job and queue, de-duplication on an injected clock, failing and slow targets, hostile
input, secrets kept out of answers and logs, and the agent and queue watchers on a real
agent registry and a real queue. Every test that stores runs on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crawlhub.agents.registry import AgentInfo, Heartbeat, open_registry
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.control.alerts import (
    EVENT_KINDS,
    AlertError,
    AlertEvent,
    AlertRoute,
    AlertService,
    AlertSettings,
    RoutePatch,
    SmtpSettings,
    make_spec,
    run_event,
    run_events,
)
from crawlhub.control.db import ControlDB
from crawlhub.control.jobs.model import JobSpec, RunRecord
from crawlhub.control.plane import ControlPlane
from crawlhub.control.secrets import SecretBox
from crawlhub.core.errors import ConflictError, NotFoundError
from crawlhub.queues import open_backend
from tests.control.alert_targets import (
    HOOK_PATH,
    TOKEN,
    SmtpInbox,
    WebhookReceiver,
    smtp_server,
)
from tests.helpers import FakeClock
from tests.servers import free_port

BOX = SecretBox([SecretBox.new_key()])
MakeAlerts = Callable[..., Awaitable[AlertService]]


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    server = await WebhookReceiver().start()
    yield server
    await server.stop()


@pytest.fixture(scope="module")
def smtp() -> Iterator[tuple[SmtpInbox, int]]:
    with smtp_server() as server:
        yield server


@pytest.fixture
def inbox(smtp: tuple[SmtpInbox, int]) -> SmtpInbox:
    smtp[0].mails.clear()
    return smtp[0]


def smtp_settings(port: int, *, password: str = SmtpInbox.PASSWORD) -> SmtpSettings:
    return SmtpSettings.from_url(f"smtp://{SmtpInbox.USER}:{password}@127.0.0.1:{port}",
                                 sender="crawlhub@example.com")


@pytest.fixture
async def make_alerts(control_db: ControlDB, clock: FakeClock) -> AsyncIterator[MakeAlerts]:
    """``await make_alerts(retries=2, ...)``: an AlertService on the test's database and
    fake clock; fast retries and a short timeout unless told."""
    made: list[AlertService] = []

    async def make(*, db: ControlDB | None = None,
                   sleep: Callable[[float], Awaitable[Any]] | None = None,
                   **settings: Any) -> AlertService:
        values: dict[str, Any] = {"timeout": 1.0, "retries": 1, "backoff": 0.01}
        values.update(settings)
        service = await AlertService.open(db or control_db, BOX, AlertSettings(**values),
                                          clock=clock, sleep=sleep or asyncio.sleep)
        made.append(service)
        return service

    yield make
    for service in made:
        await service.close(grace=1.0)


def webhook(name: str, url: str, **fields: Any) -> Any:
    return make_spec({"name": name, "kind": "webhook", "url": url, **fields})


def failed(job: str = "shop-eu", run: str = "r-1", **details: Any) -> AlertEvent:
    return run_event("run_failed", job=job, run=run, message="exited with code 2",
                     exit_code=2, **details)


# -- delivery to real targets -----------------------------------------------------------
async def test_a_webhook_route_receives_slack_compatible_json(
        make_alerts: MakeAlerts, receiver: WebhookReceiver, clock: FakeClock) -> None:
    alerts = await make_alerts()
    await alerts.create(webhook("shop-slack", receiver.url(), jobs=["shop-*"]))

    assert await alerts.notify(failed())
    await alerts.drain()

    [hit] = receiver.hits
    assert hit.path == HOOK_PATH and hit.headers["Content-Type"].startswith("application/json")
    assert hit.body["text"] == "*job shop-eu: run r-1 failed*\nexited with code 2"
    fields = hit.body["crawlhub"]
    assert (fields["event"], fields["job"], fields["run"]) == ("run_failed", "shop-eu", "r-1")
    assert fields["details"] == {"exit_code": 2} and fields["ts"] == clock()
    [delivery] = await alerts.deliveries()
    assert (delivery.route, delivery.event, delivery.job, delivery.run, delivery.status,
            delivery.attempts, delivery.answer) == (
        "shop-slack", "run_failed", "shop-eu", "r-1", "sent", 1, "HTTP 200")


async def test_an_email_route_sends_the_alert_over_smtp_with_login(
        make_alerts: MakeAlerts, inbox: SmtpInbox, smtp: tuple[SmtpInbox, int]) -> None:
    alerts = await make_alerts(smtp=smtp_settings(smtp[1]))
    await alerts.create(make_spec({"name": "ops-mail", "kind": "email",
                                   "to": ["ops@example.com", "dev@example.com"]}))

    await alerts.notify(run_event("run_no_items", job="shop", run="r-2",
                                  message="it ended well but counted no items",
                                  counters={"items": 0}))
    await alerts.drain()

    [mail] = inbox.mails
    assert mail.authenticated and mail.sender == "crawlhub@example.com"
    assert mail.recipients == ["ops@example.com", "dev@example.com"]
    assert mail.message["Subject"] == "[crawlhub] job shop: run r-2 produced no items"
    assert mail.message["To"] == "ops@example.com, dev@example.com"
    body = mail.message.get_body().get_content()  # type: ignore[union-attr]
    assert "it ended well but counted no items" in body and "job: shop" in body
    assert '"items": 0' in body
    [delivery] = await alerts.deliveries(route="ops-mail")
    assert delivery.status == "sent" and delivery.answer.startswith("250 OK queued as 42")


async def test_a_refused_smtp_login_is_a_failed_delivery_naming_the_server(
        make_alerts: MakeAlerts, inbox: SmtpInbox, smtp: tuple[SmtpInbox, int]) -> None:
    alerts = await make_alerts(smtp=smtp_settings(smtp[1], password="wrong-pw-1a2b"))
    await alerts.create(make_spec({"name": "ops", "kind": "email", "to": ["ops@example.com"]}))

    result = await alerts.test("ops")

    assert not result.ok and not inbox.mails
    assert result.error.startswith(f"smtp://127.0.0.1:{smtp[1]} refused the login: 535")
    assert "wrong-pw-1a2b" not in result.error


async def test_email_without_an_smtp_server_says_what_to_set(make_alerts: MakeAlerts) -> None:
    alerts = await make_alerts()
    await alerts.create(make_spec({"name": "ops", "kind": "email", "to": ["ops@example.com"]}))

    result = await alerts.test("ops")

    assert not result.ok and "set control.smtp_url" in result.error


# -- routing ----------------------------------------------------------------------------
def route(**fields: Any) -> AlertRoute:
    values: dict[str, Any] = {"name": "r", "kind": "webhook", "target": "x", "to": [],
                              "events": list(EVENT_KINDS), "jobs": [], "queues": [],
                              "enabled": True, "created": 0.0, "updated": 0.0}
    values.update(fields)
    return AlertRoute(**values)


def test_routes_match_by_event_job_pattern_and_queue_pattern() -> None:
    everything = route()
    shop = route(jobs=["shop-*", "blog"], events=["run_failed"])
    queues = route(queues=["eu-?"], events=["queue_stalled", "agent_dead"])
    muted = route(enabled=False)
    dead = AlertEvent(kind="agent_dead", agent="a1")

    assert everything.matches(failed(job="anything"))
    assert shop.matches(failed(job="shop-eu")) and shop.matches(failed(job="blog"))
    assert not shop.matches(failed(job="blog-2")) and not shop.matches(failed(job="SHOP-eu"))
    assert not shop.matches(run_event("run_no_items", job="shop-eu"))
    assert queues.matches(AlertEvent(kind="queue_stalled", queue="eu-1"))
    assert not queues.matches(AlertEvent(kind="queue_stalled", queue="us-1"))
    assert queues.matches(dead) and not shop.matches(dead)  # agents ignore jobs/queues
    assert not queues.matches(failed())
    assert not muted.matches(failed()) and not muted.matches(dead)


async def test_each_event_reaches_exactly_the_routes_that_want_it(
        make_alerts: MakeAlerts, receiver: WebhookReceiver) -> None:
    alerts = await make_alerts(interval=0)
    await alerts.create(webhook("all", receiver.url("/all")))
    await alerts.create(webhook("shop", receiver.url("/shop"), jobs=["shop-*"],
                                events=["run_failed"]))
    await alerts.create(webhook("eu", receiver.url("/eu"), queues=["eu-*"],
                                events=["queue_stalled"]))
    await alerts.create(webhook("muted", receiver.url("/muted"), enabled=False))

    for event in (failed(job="shop-eu"), failed(job="blog"),
                  run_event("run_no_items", job="shop-eu"),
                  AlertEvent(kind="queue_stalled", queue="eu-1"),
                  AlertEvent(kind="queue_stalled", queue="us-1"),
                  AlertEvent(kind="agent_dead", agent="a1")):
        await alerts.notify(event)
    await alerts.drain()

    def got(path: str) -> list[tuple[str, str | None]]:
        return sorted((b["crawlhub"]["event"], b["crawlhub"]["job"] or b["crawlhub"]["queue"]
                       or b["crawlhub"]["agent"]) for b in receiver.bodies(path))

    assert got("/all") == sorted([("run_failed", "shop-eu"), ("run_failed", "blog"),
                                  ("run_no_items", "shop-eu"), ("queue_stalled", "eu-1"),
                                  ("queue_stalled", "us-1"), ("agent_dead", "a1")])
    assert got("/shop") == [("run_failed", "shop-eu")]
    assert got("/eu") == [("queue_stalled", "eu-1")]
    assert got("/muted") == []


# -- de-duplication ---------------------------------------------------------------------
async def test_the_same_alert_is_not_sent_again_within_the_interval(
        make_alerts: MakeAlerts, receiver: WebhookReceiver, clock: FakeClock) -> None:
    alerts = await make_alerts(interval=600)
    await alerts.create(webhook("hook", receiver.url()))

    await alerts.notify(failed(run="r-1"))
    await alerts.notify(failed(run="r-2"))              # same kind, same job: held back
    await alerts.notify(run_event("run_no_items", job="shop-eu", run="r-2"))  # other kind
    await alerts.notify(failed(job="blog", run="r-9"))  # other job
    await alerts.drain()
    clock.advance(599)
    await alerts.notify(failed(run="r-3"))
    await alerts.drain()
    clock.advance(2)
    await alerts.notify(failed(run="r-4"))
    await alerts.drain()

    sent = [(b["crawlhub"]["event"], b["crawlhub"]["run"]) for b in receiver.bodies()]
    assert sorted(sent) == sorted([("run_failed", "r-1"), ("run_no_items", "r-2"),
                                   ("run_failed", "r-9"), ("run_failed", "r-4")])
    assert alerts.suppressed == 2


async def test_two_processes_on_one_database_send_an_alert_once(
        make_alerts: MakeAlerts, receiver: WebhookReceiver, control_db: ControlDB) -> None:
    other_db = await ControlDB.open(control_db.url, prefix=control_db.prefix)
    try:
        first = await make_alerts()
        second = await make_alerts(db=other_db)
        await first.create(webhook("hook", receiver.url()))

        await asyncio.gather(first.notify(failed()), second.notify(failed()))
        await asyncio.gather(first.drain(), second.drain())

        assert len(receiver.hits) == 1 and first.suppressed + second.suppressed == 1
    finally:
        await second.close()
        await other_db.close()


async def test_a_failed_delivery_gives_its_claim_back(
        make_alerts: MakeAlerts, receiver: WebhookReceiver) -> None:
    alerts = await make_alerts(interval=600, retries=1)
    await alerts.create(webhook("hook", receiver.url()))
    receiver.status = 500

    await alerts.notify(failed(run="r-1"))
    await alerts.drain()
    receiver.status = 200
    await alerts.notify(failed(run="r-2"))  # within the interval, but r-1 never arrived
    await alerts.drain()

    assert [b["crawlhub"]["run"] for b in receiver.bodies()] == ["r-1", "r-1", "r-2"]
    statuses = [(d.run, d.status, d.attempts) for d in await alerts.deliveries()]
    assert statuses == [("r-2", "sent", 1), ("r-1", "failed", 2)]


# -- failing targets ----------------------------------------------------------------------
async def test_a_target_that_refuses_connections_is_retried_then_recorded_as_failed(
        make_alerts: MakeAlerts, caplog: pytest.LogCaptureFixture) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    alerts = await make_alerts(retries=2, backoff=0.5, sleep=sleep)
    port = free_port()
    await alerts.create(webhook("down", f"http://127.0.0.1:{port}{HOOK_PATH}"))

    assert await alerts.notify(failed()) is True  # queued; nothing raised
    assert waits == []  # returned before the first attempt, not after the retries
    await alerts.drain()

    assert waits == [0.5, 1.0]
    [delivery] = await alerts.deliveries()
    assert delivery.status == "failed" and delivery.attempts == 3
    assert delivery.error.startswith(f"cannot connect to http://127.0.0.1:{port}/***")
    assert "failed after 3 attempts" in caplog.text


async def test_a_slow_target_times_out(make_alerts: MakeAlerts,
                                       receiver: WebhookReceiver) -> None:
    alerts = await make_alerts(timeout=0.3, retries=0)
    await alerts.create(webhook("slow", receiver.url()))
    receiver.delay = 5.0

    result = await alerts.test("slow")

    assert not result.ok and result.error == "no answer within 0.3 s (control.alert_timeout)"


async def test_an_error_status_fails_the_delivery_with_the_answer(
        make_alerts: MakeAlerts, receiver: WebhookReceiver) -> None:
    alerts = await make_alerts()
    await alerts.create(webhook("hook", receiver.url()))
    receiver.status = 404

    result = await alerts.test("hook")

    assert not result.ok and result.error == "the webhook answered HTTP 404"


async def test_redirects_are_followed_on_the_same_host_only(
        make_alerts: MakeAlerts, receiver: WebhookReceiver) -> None:
    alerts = await make_alerts()
    receiver.redirects = {"/moved": "/services/new",
                          "/away": f"http://127.0.0.2:{receiver.port}/services/new"}
    await alerts.create(webhook("moved", receiver.url("/moved")))
    await alerts.create(webhook("away", receiver.url("/away")))

    moved = await alerts.test("moved")
    away = await alerts.test("away")

    assert moved.ok and [h.path for h in receiver.hits] == ["/services/new"]
    assert not away.ok and "a redirect to another host is not followed" in away.error
    assert len(receiver.hits) == 1


async def test_a_full_queue_drops_events_without_blocking_or_raising(
        make_alerts: MakeAlerts, receiver: WebhookReceiver) -> None:
    alerts = await make_alerts(queue_size=2, interval=0)
    await alerts.create(webhook("hook", receiver.url()))

    queued = [await alerts.notify(failed(run=f"r-{i}")) for i in range(6)]
    await alerts.drain()

    assert queued == [True, True, False, False, False, False] and alerts.dropped == 4
    assert len(receiver.hits) == 2


async def test_notify_after_close_is_refused_quietly(make_alerts: MakeAlerts) -> None:
    alerts = await make_alerts()
    await alerts.close()

    assert await alerts.notify(failed()) is False


# -- the test button ----------------------------------------------------------------------
async def test_the_test_button_sends_now_even_to_a_muted_route_and_records_it(
        make_alerts: MakeAlerts, receiver: WebhookReceiver) -> None:
    alerts = await make_alerts()
    await alerts.create(webhook("hook", receiver.url(), enabled=False))

    result = await alerts.test("hook")

    assert result.ok and result.answer == "HTTP 200" and result.error == ""
    [hit] = receiver.hits
    assert hit.body["crawlhub"]["event"] == "test"
    assert hit.body["text"].startswith("*test alert of route hook*")
    [delivery] = await alerts.deliveries(route="hook")
    assert (delivery.event, delivery.status) == ("test", "sent")
    with pytest.raises(NotFoundError):
        await alerts.test("nope")


# -- routes: CRUD and hostile input -----------------------------------------------------
async def test_routes_are_stored_changed_and_removed(
        make_alerts: MakeAlerts, receiver: WebhookReceiver, clock: FakeClock) -> None:
    alerts = await make_alerts()
    created = await alerts.create(webhook("hook", receiver.url(), jobs=["shop-*", "shop-*"]))
    assert created.target == f"http://127.0.0.1:{receiver.port}/***"
    assert created.jobs == ["shop-*"] and created.events == list(EVENT_KINDS)
    with pytest.raises(ConflictError):
        await alerts.create(webhook("hook", receiver.url()))

    clock.advance(10)
    muted = await alerts.update("hook", RoutePatch(enabled=False, events=["run_failed"]))
    assert not muted.enabled and muted.events == ["run_failed"]
    assert muted.updated == created.updated + 10 and muted.created == created.created
    mail = await alerts.update("hook", RoutePatch(kind="email", to=["ops@example.com"]))
    assert (mail.kind, mail.target, mail.url) == ("email", "ops@example.com", None)
    with pytest.raises(AlertError, match="an email route needs at least one address"):
        await alerts.update("hook", RoutePatch(to=[]))

    assert [r.name for r in await alerts.routes()] == ["hook"]
    await alerts.delete("hook")
    assert await alerts.routes() == []
    with pytest.raises(NotFoundError):
        await alerts.delete("hook")
    with pytest.raises(NotFoundError):
        await alerts.update("hook", RoutePatch(enabled=True))


@pytest.mark.parametrize("fields, problem", [
    ({"name": "../etc"}, "a route name is 1 to 64"),
    ({"name": "a b"}, "a route name"),
    ({"name": "x" * 65}, "a route name"),
    ({"name": "été"}, "a route name"),
    ({"url": "file:///etc/passwd"}, "must start with https:// or http://, not file://"),
    ({"url": "gopher://127.0.0.1:70/_SET"}, "not gopher://"),
    ({"url": "javascript:alert(1)"}, "not javascript://"),
    ({"url": "//127.0.0.1/hook"}, "must start with https:// or http://"),
    ({"url": "http://"}, "has no host"),
    ({"url": "http://127.0.0.1:99999/x"}, "not a valid URL"),
    ({"url": "http://127.0.0.1/a b"}, "no spaces or control characters"),
    ({"url": "http://127.0.0.1/\r\nX-Evil: 1"}, "no spaces or control characters"),
    ({"url": "https://h/" + "a" * 3000}, "at most 2048 characters"),
    ({"url": None}, "a webhook route needs a url"),
    ({"to": ["ops@example.com"]}, "a webhook route takes no 'to'"),
    ({"events": ["run_failed", "everything"]}, "events.1"),
    ({"events": []}, "events"),
    ({"jobs": ["shop\n*"]}, "a job or queue pattern"),
    ({"jobs": ["x" * 201]}, "a job or queue pattern"),
    ({"colour": "red"}, "colour: Extra inputs are not permitted"),
])
def test_hostile_webhook_routes_are_refused_without_echoing_the_url(
        fields: dict[str, Any], problem: str) -> None:
    data = {"name": "hook", "kind": "webhook", "url": f"https://hooks.example.com{HOOK_PATH}",
            **fields}
    with pytest.raises(AlertError) as caught:
        make_spec(data)
    assert problem in str(caught.value)
    assert TOKEN not in str(caught.value) and "/etc/passwd" not in str(caught.value)


@pytest.mark.parametrize("address", [
    "ops@example.com\r\nBcc: victim@example.com", "Ops <ops@example.com>",
    "a@example.com,b@example.com", "ops", "ops@", "ops@-bad-.com", "ops@exa mple.com",
    "ópś@example.com", "x" * 65 + "@example.com",
])
def test_hostile_email_addresses_are_refused(address: str) -> None:
    with pytest.raises(AlertError, match="an email address looks like"):
        make_spec({"name": "ops", "kind": "email", "to": [address]})


async def test_subjects_lose_cr_lf_and_huge_messages_are_cut(
        make_alerts: MakeAlerts, receiver: WebhookReceiver, inbox: SmtpInbox,
        smtp: tuple[SmtpInbox, int]) -> None:
    alerts = await make_alerts(smtp=smtp_settings(smtp[1]), interval=0)
    await alerts.create(make_spec({"name": "ops", "kind": "email", "to": ["ops@example.com"]}))
    await alerts.create(webhook("hook", receiver.url()))
    event = AlertEvent(kind="run_failed", job="shop", run="r-1",
                       subject="boom\r\nBcc: victim@example.com\r\n\r\nforged body",
                       message="<!channel> " + "m" * 100_000,
                       details={"log": "l" * 100_000,
                                **{f"k{i}": "v" * 500 for i in range(100)}})

    await alerts.notify(event)
    await alerts.drain()

    [mail] = inbox.mails
    assert mail.recipients == ["ops@example.com"] and mail.message["Bcc"] is None
    assert mail.message["Subject"] == ("[crawlhub] boom Bcc: victim@example.com forged"
                                       " body")
    assert len(mail.message.as_bytes()) < 40_000
    [body] = receiver.bodies()
    assert body["text"].startswith("*boom Bcc: victim@example.com forged body*\n&lt;!channel&gt;")
    assert body["text"].endswith("(96011 more characters)")
    details = body["crawlhub"]["details"]
    assert details["truncated"] is True and len(details["log"]) == 1001
    assert 10 < len(details) < 20


# -- secrets ----------------------------------------------------------------------------
async def test_secrets_stay_out_of_routes_errors_logs_and_the_database(
        make_alerts: MakeAlerts, receiver: WebhookReceiver, control_db: ControlDB,
        caplog: pytest.LogCaptureFixture, smtp: tuple[SmtpInbox, int]) -> None:
    caplog.set_level(logging.DEBUG)
    bad_password = "hunter2-smtp-77"
    alerts = await make_alerts(smtp=smtp_settings(smtp[1], password=bad_password))
    down = f"http://127.0.0.1:{free_port()}{HOOK_PATH}?token={TOKEN}"
    await alerts.create(webhook("down", down))
    await alerts.create(webhook("hook", receiver.url()))
    await alerts.create(make_spec({"name": "mail", "kind": "email", "to": ["o@example.com"]}))
    receiver.status = 500

    await alerts.notify(failed())
    await alerts.drain()
    results = [await alerts.test(name) for name in ("down", "hook", "mail")]
    await alerts.update("hook", RoutePatch(url=f"http://127.0.0.1:1/{TOKEN}/2"))

    shown = repr([r.as_dict() for r in await alerts.routes()]) + repr(
        [r for r in await alerts.routes()]) + repr([d.as_dict() for d in
                                                    await alerts.deliveries()])
    shown += repr([r.as_dict() for r in results])
    assert TOKEN not in shown and bad_password not in shown
    logged = "\n".join(r.getMessage() for r in caplog.records
                       if r.name.startswith("crawlhub"))
    assert "failed after 2 attempts" in logged  # the log did say something
    assert TOKEN not in logged and bad_password not in logged
    raw = await control_db.fetch(f"SELECT url FROM {control_db.table('alerts')}")
    assert all(TOKEN not in (row[0] or "") for row in raw)
    assert (await alerts.get("down")).url.reveal() == down  # type: ignore[union-attr]


def test_the_smtp_password_is_masked_in_settings() -> None:
    settings = SmtpSettings.from_url("smtp://me%40corp:p%40ss@mail.example.com:587",
                                     sender="crawlhub@example.com")
    assert settings.user == "me@corp" and settings.password is not None
    assert settings.password.reveal() == "p@ss" and "p@ss" not in repr(settings)
    assert settings.where == "smtp://mail.example.com:587"
    assert SmtpSettings.from_url("smtps://h", sender="a@b.c").port == 465


# -- runs -> events -----------------------------------------------------------------------
def run(status: str, counters: dict[str, Any] | None = None, **fields: Any) -> RunRecord:
    return RunRecord(id="r-7", job="shop", kind="subprocess", status=status, trigger="cron",
                     started_at=1000.0, finished_at=1060.0, counters=counters or {}, **fields)


SPEC = JobSpec(name="shop", command=["python", "shop.py"], timeout=30)


@pytest.mark.parametrize("record, kind, message", [
    (run("failed", exit_code=2, error="exited with code 2"), "run_failed", "exited with code 2"),
    (run("lost"), "run_failed", "its host stopped answering"),
    (run("timeout", error="ran over its timeout of 30 s"), "run_over_time",
     "ran over its timeout of 30 s"),
    (run("succeeded", {"items": 0, "pages": 5}), "run_no_items",
     "it ended well but counted no items"),
    (run("succeeded", {"finish_reason": "finished", "response_received_count": 3}),
     "run_no_items", "it ended well but counted no items"),
    (run("succeeded", {"items": 4}), None, None),
    (run("succeeded", {"item_scraped_count": 1, "items": 0}), None, None),
    (run("succeeded"), None, None),                   # counts nothing: cannot tell
    (run("succeeded", {"pages_ok": 3}), None, None),
    (run("cancelled"), None, None),
    (run("skipped"), None, None),
])
def test_a_finished_run_becomes_the_right_event(record: RunRecord, kind: str | None,
                                                message: str | None) -> None:
    events = run_events(SPEC, record)
    if kind is None:
        assert events == []
        return
    [event] = events
    assert (event.kind, event.job, event.run, event.message) == (kind, "shop", "r-7", message)
    assert event.ts == 1060.0 and event.details["duration"] == 60.0
    assert event.details["status"] == record.status


async def test_run_finished_notifies_the_routes(
        make_alerts: MakeAlerts, receiver: WebhookReceiver) -> None:
    alerts = await make_alerts()
    await alerts.create(webhook("hook", receiver.url(), events=["run_over_time"]))

    await alerts.run_finished(SPEC, run("timeout"))
    await alerts.run_finished(SPEC, run("failed"))
    await alerts.drain()

    [body] = receiver.bodies()
    assert body["text"].startswith("*job shop: run r-7 is over its time limit*")
    assert body["crawlhub"]["details"]["timeout"] == 30


def test_event_kinds_are_checked() -> None:
    with pytest.raises(ValueError, match="not one of"):
        AlertEvent(kind="run_exploded")
    with pytest.raises(ValueError, match="not a run event"):
        run_event("agent_dead", job="x")


# -- watchers ---------------------------------------------------------------------------
def agent(agent_id: str) -> AgentInfo:
    return AgentInfo(agent_id=agent_id, host="box-1", pid=42, version="1", queues=["eu-1"],
                     started=1.0, concurrency=8)


async def test_an_agent_that_goes_silent_fires_agent_dead_once(
        make_alerts: MakeAlerts, receiver: WebhookReceiver, clock: FakeClock,
        tmp_path: Path) -> None:
    registry = open_registry(f"sqlite:///{tmp_path}/agents.db", dead_after=11, clock=clock)
    try:
        alerts = await make_alerts(interval=600)
        await alerts.create(webhook("hook", receiver.url(), events=["agent_dead"]))
        await registry.register(agent("a1"))
        await registry.register(agent("leaving"))
        past = open_registry(f"sqlite:///{tmp_path}/agents.db", dead_after=11,
                             clock=lambda: clock() - 100)
        await past.register(agent("long-dead"))  # dead before anyone watched
        await past.close()
        watcher = alerts.watcher(registry)

        assert await watcher.poll() == []
        await registry.unregister("leaving")      # a clean shutdown is no death
        clock.advance(12)
        [event] = await watcher.poll()
        assert (event.kind, event.agent) == ("agent_dead", "a1")
        assert event.subject == "agent a1 on box-1 is dead"
        assert event.message == "No heartbeat for 12 s (dead after 11 s). It served: eu-1."
        assert await watcher.poll() == []         # once per death
        await alerts.drain()
        assert [b["crawlhub"]["agent"] for b in receiver.bodies()] == ["a1"]

        await registry.heartbeat("a1", Heartbeat())  # back ...
        assert await watcher.poll() == []
        clock.advance(12)                            # ... and dead again, 12 s later
        assert [e.agent for e in await watcher.poll()] == ["a1"]
        await alerts.drain()
        assert len(receiver.hits) == 1 and alerts.suppressed == 1  # within the interval
    finally:
        await registry.close()


async def test_a_queue_that_stops_draining_fires_queue_stalled_once(
        make_alerts: MakeAlerts, receiver: WebhookReceiver, clock: FakeClock,
        tmp_path: Path) -> None:
    backend = open_backend(f"sqlite:///{tmp_path}/queues.db")
    queue = backend.queue("eu-1")

    async def stats() -> dict[str, Any]:
        return {"eu-1": await queue.stats(), "empty": {"left": 0, "success": 0},
                "away": {"left": None, "success": 3}}

    try:
        alerts = await make_alerts(stall_after=600, interval=0)
        await alerts.create(webhook("hook", receiver.url(), events=["queue_stalled"]))
        for n in range(3):
            await queue.push({"n": n})
        watcher = alerts.watcher(None, stats)

        assert await watcher.poll() == []
        clock.advance(599)
        assert await watcher.poll() == []
        clock.advance(2)
        [event] = await watcher.poll()
        assert (event.kind, event.queue, event.details["left"]) == ("queue_stalled", "eu-1", 3)
        assert event.message.startswith("3 tasks left and no success for 601 s")
        clock.advance(1000)
        assert await watcher.poll() == []          # once, until it moves

        [message] = await queue.lease(1)
        await queue.ack([message.id])               # it moves: the watch starts again
        assert await watcher.poll() == []
        clock.advance(601)
        assert [e.queue for e in await watcher.poll()] == ["eu-1"]

        for m in await queue.lease(10):
            await queue.ack([m.id])                 # drained
        clock.advance(5000)
        assert await watcher.poll() == []
        await alerts.drain()
        assert [b["crawlhub"]["queue"] for b in receiver.bodies()] == ["eu-1", "eu-1"]
    finally:
        await backend.close()


async def test_queue_stats_may_be_the_hubs_list_of_outbound_rows(
        make_alerts: MakeAlerts, clock: FakeClock) -> None:
    alerts = await make_alerts(stall_after=60)

    async def outbound_stats() -> list[dict[str, Any]]:  # hub.outbound_stats()'s shape
        return [{"name": "eu-2", "left": 5, "success": 1, "failed": 0, "total": 6},
                {"name": "down", "left": None, "success": 0}]

    watcher = alerts.watcher(None, outbound_stats)
    assert await watcher.poll() == []
    clock.advance(61)
    [event] = await watcher.poll()
    assert (event.queue, event.details["left"], event.details["total"]) == ("eu-2", 5, 6)


async def test_a_watcher_keeps_going_when_a_backend_fails(make_alerts: MakeAlerts,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    alerts = await make_alerts()
    calls = 0

    async def broken() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        raise ConnectionError("redis is away")

    alerts.start_watch(None, broken, interval=0.01)
    for _ in range(100):
        if calls >= 3:
            break
        await asyncio.sleep(0.01)
    await alerts.close()

    assert calls >= 3 and "cannot read the queue stats: ConnectionError" in caplog.text


# -- through the control plane ------------------------------------------------------------
async def test_a_failing_and_an_overlong_job_alert_their_routes_through_the_plane(
        tmp_path: Path, receiver: WebhookReceiver) -> None:
    plane = await ControlPlane.open(CrawlhubConfig.model_validate(
        {"data_dir": str(tmp_path), "control": {"grace": 1}}))
    try:
        await plane.alerts.create(webhook("boom", receiver.url("/boom"), jobs=["boom"]))
        await plane.alerts.create(webhook("slow", receiver.url("/slow"), jobs=["slow"],
                                          events=["run_over_time"]))
        await plane.jobs.create(JobSpec(name="boom", command=[
            sys.executable, "-c", "import sys; sys.exit(3)"]))
        await plane.jobs.create(JobSpec(name="slow", timeout=0.2, command=[
            sys.executable, "-c", "import time; time.sleep(30)"]))

        await plane.jobs.run("boom")
        await plane.jobs.run("slow")
        for _ in range(100):
            if len(receiver.hits) >= 2:
                break
            await asyncio.sleep(0.05)
        await plane.alerts.drain()

        [boom] = receiver.bodies("/boom")
        assert boom["text"].startswith("*job boom: run ") and "exited with code 3" in boom["text"]
        assert boom["crawlhub"]["details"]["exit_code"] == 3
        [slow] = receiver.bodies("/slow")
        assert slow["crawlhub"]["event"] == "run_over_time"
        assert slow["crawlhub"]["details"]["timeout"] == 0.2
    finally:
        await plane.close()

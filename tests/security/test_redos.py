"""Hostile regular expressions from clients that submit tasks (issue 19.9): user regexes
run on RE2, so ``(a+)+$`` on a 29-byte page neither stalls an agent nor stops its
heartbeats, and a pattern RE2 refuses (a backreference) is a 4xx at intake."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from aiohttp import web

from crawlhub.agents.agent import Agent, CrawledPage, HubReport
from crawlhub.agents.downloader import Downloader
from crawlhub.agents.extract import ExtractionRules
from crawlhub.app.asgi import create_app
from crawlhub.config.loader import load_config
from crawlhub.core.errors import ConfigError
from crawlhub.services import Services
from tests.agents.test_agent import config
from tests.helpers import wait_for

#: The issue's page: 28 ``a`` and a ``!`` (29 bytes); ``(a+)+$`` backtracks 2^28 ways on
#: Python's ``re`` before it fails.
HOSTILE_PAGE = b"a" * 28 + b"!"
HOSTILE = "(a+)+$"


@pytest.fixture
async def hostile_site() -> AsyncIterator[str]:
    async def page(request: web.Request) -> web.Response:
        return web.Response(body=HOSTILE_PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/{name}", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_catastrophic_pattern_on_a_29_byte_page_neither_stalls_the_agent_nor_its_heartbeats(
        tmp_path: Path, hostile_site: str) -> None:
    # every way a task's rules hold a regex: a field, an XPath re:test, link allow / deny
    extract = {"fields": {"x": {"regex": HOSTILE},
                          "y": {"xpath": f"boolean(//body[re:test(., '{HOSTILE}')])"}},
               "links": {"follow": True, "allow": [HOSTILE], "deny": [HOSTILE]}}
    fields: dict[str, Any] = {}

    async def on_pages(pages: list[CrawledPage]) -> None:
        for p in pages:
            fields[p.task["task_uuid"]] = p.extracted.fields if p.extracted else None

    services = await Services.open(config(tmp_path))
    downloader = Downloader()
    try:
        results = await services.hub.submit(
            [{"task_uuid": f"hostile-{n}", "url": f"{hostile_site}/p{n}", "extract": extract}
             for n in range(3)])
        assert [r.status for r in results] == ["routed"] * 3  # valid RE2: taken in
        agent = Agent({"pages": services.queues.queue("pages")}, downloader,
                      report=HubReport(services.hub, "http"), on_pages=on_pages,
                      registry=services.agents, heartbeat_every=0.05, concurrency=1)
        beats: list[float] = []

        async def settled_and_beating() -> bool:
            status = await services.agents.get(agent.agent_id)
            if status is not None and status.beat is not None and \
                    (not beats or status.last_seen != beats[-1]):
                beats.append(status.last_seen)
            counters = (await services.state.counters()).get("pages", {})
            return counters.get("success") == 3 and len(beats) >= 3

        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        try:
            # with Python's re the first page alone held the loop (and this wait, and
            # the heartbeats) for tens of seconds
            await wait_for(settled_and_beating, "3 results and 3 heartbeats", timeout=30)
        finally:
            stop.set()
            await running
        assert fields == {f"hostile-{n}": {"x": None, "y": False} for n in range(3)}
    finally:
        await downloader.close()
        await services.close()


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx2.AsyncClient]:
    services = await Services.open(config(tmp_path))
    transport = httpx2.ASGITransport(app=create_app(services=services),
                                     raise_app_exceptions=False)
    async with httpx2.AsyncClient(transport=transport, base_url="http://crawlhub.test") as c:
        yield c
    await services.close()


@pytest.mark.parametrize(("rules", "key", "why"), [
    ({"fields": {"x": {"regex": r"(a+)\1"}}}, "extract.fields.x.regex",
     "backreferences are not supported"),
    ({"fields": {"x": {"regex": r"(?<=\$)\d+"}}}, "extract.fields.x.regex",
     "lookbehinds are not supported"),
    ({"fields": {"x": {"xpath": r"//p[re:test(., '(\w)\1')]"}}}, "extract.fields.x.xpath",
     "backreferences are not supported"),
    ({"links": {"follow": True, "deny": ["(?!ok)"]}}, "extract.links.deny",
     "lookaheads are not supported"),
])
async def test_a_pattern_re2_refuses_is_a_4xx_at_intake_naming_the_key_and_why(
        client: httpx2.AsyncClient, rules: dict[str, Any], key: str, why: str) -> None:
    one = await client.post("/task/", json={"url": "http://127.0.0.1:9/x", "extract": rules})
    assert one.status_code == 422, one.text
    detail = one.json()["detail"]
    assert key in detail and why in detail and "RE2" in detail
    many = await client.post("/task/", json=[{"url": "http://127.0.0.1:9/x", "extract": rules},
                                             {"url": "http://127.0.0.1:9/y"}])
    answers = many.json()["tasks"]
    assert [a["status"] for a in answers] == ["rejected", "routed"]
    assert key in answers[0]["reason"]


def test_a_pattern_re2_refuses_in_a_config_file_is_a_config_error_naming_file_and_key(
        tmp_path: Path) -> None:
    path = tmp_path / "crawlhub.yaml"
    path.write_text("data_dir: .\nagent:\n  downloader:\n    ban: {body_regex: '(?=captcha)'}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "file crawlhub.yaml" in str(err.value) and "body_regex" in str(err.value)
    assert "lookaheads are not supported" in str(err.value)
    with pytest.raises(ConfigError, match=r"extract\.fields\.p\.regex.*backreferences"):
        ExtractionRules.from_config({"fields": {"p": {"regex": r"(\d)\1"}}})


async def test_the_dry_run_of_a_task_says_its_refused_rules_would_be_rejected(
        client: httpx2.AsyncClient) -> None:
    answer = await client.post("/inbound/http/check_task/", json={
        "url": "http://127.0.0.1:9/x", "extract": {"fields": {"x": {"regex": r"(a)\1"}}}})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["action"] == "reject" and report["outbound"] is None
    assert "extract.fields.x.regex" in report["reason"] and "backreferences" in report["reason"]

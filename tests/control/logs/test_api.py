"""``GET /logs`` and ``GET /logs/tail`` on a real app: search and paging in process, the
SSE tail through uvicorn on 127.0.0.1 (a stream needs a socket)."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.control.logs import LogLine, LogService
from crawlhub.services import Services
from tests.api.live import serve
from tests.control.logs.conftest import MakeLine


def make_config(tmp_path: Path) -> CrawlhubConfig:
    return CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": "default", "init": {"key": "default"}}],
        "failure": {"path": str(tmp_path / "failures.jsonl")}})


@dataclass
class Api:
    svc: Services
    client: httpx2.AsyncClient

    @property
    def logs(self) -> LogService:
        assert self.svc.control is not None
        return self.svc.control.logs

    async def write(self, lines: list[LogLine]) -> None:
        await self.logs.write(lines)
        await self.logs.flush()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    svc = await Services.open(make_config(tmp_path))
    transport = httpx2.ASGITransport(app=create_app(services=svc), raise_app_exceptions=False)
    client = httpx2.AsyncClient(transport=transport, base_url="http://crawlhub.test")
    try:
        yield Api(svc, client)
    finally:
        await client.aclose()
        await svc.close()


# -- search -----------------------------------------------------------------------------
async def test_search_with_filters_answers_lines_newest_first(api: Api, line: MakeLine
                                                              ) -> None:
    await api.write([line("fetch https://a.example/1 timeout", job="news", run="r1",
                          task="t1", level="error", stream="stderr", ts=1714564800.0),
                     line("fetch ok", job="news", run="r1", task="t2", ts=1714564801.0),
                     line("timeout elsewhere", job="shop", level="warning")])
    answer = await api.client.get("/logs", params={"job": "news", "q": "timeout",
                                                   "level": "warning"})
    assert answer.status_code == 200
    body = answer.json()
    assert body["next"] is None
    [row] = body["lines"]
    assert {k: row[k] for k in ("ts", "level", "source", "job", "run", "task", "stream",
                                "message")} == {
        "ts": 1714564800.0, "level": "error", "source": "job", "job": "news", "run": "r1",
        "task": "t1", "stream": "stderr", "message": "fetch https://a.example/1 timeout"}
    assert isinstance(row["id"], int)
    since = await api.client.get("/logs", params={"since": "2024-05-01T12:00:00.5Z",
                                                  "job": "news"})
    assert [x["message"] for x in since.json()["lines"]] == ["fetch ok"]
    until = await api.client.get("/logs", params={"until": "1714564800.5"})
    assert [x["message"] for x in until.json()["lines"]] == [
        "fetch https://a.example/1 timeout"]


async def test_paging_follows_next_until_null(api: Api, line: MakeLine) -> None:
    await api.write([line(f"page line {i}", task="p") for i in range(7)])
    seen: list[str] = []
    params: dict[str, Any] = {"task": "p", "limit": 3}
    while True:
        body = (await api.client.get("/logs", params=params)).json()
        seen += [x["message"] for x in body["lines"]]
        if body["next"] is None:
            break
        params["before"] = body["next"]
    assert seen == [f"page line {i}" for i in reversed(range(7))]


@pytest.mark.parametrize("q", ['"', "NEAR(", "a:*", "-", "'; drop table x;--", "*", "!"])
async def test_hostile_search_text_is_a_200(api: Api, line: MakeLine, q: str) -> None:
    await api.write([line("x")])
    answer = await api.client.get("/logs", params={"q": q})
    assert answer.status_code == 200 and "lines" in answer.json()


@pytest.mark.parametrize("params, says", [
    ({"level": "loud"}, "level='loud' is not a level"),
    ({"since": "last tuesday"}, "since='last tuesday' is not a time"),
    ({"until": "nan"}, "until='nan'"),
    ({"limit": 0}, "limit"),
    ({"limit": 1001}, "limit"),
    ({"before": 0}, "before"),
    ({"q": "x" * 1001}, "q"),
    ({"q": " ".join(f"w{i}" for i in range(20))}, "terms"),
])
async def test_bad_parameters_are_422_with_a_reason(api: Api, params: dict[str, Any],
                                                    says: str) -> None:
    answer = await api.client.get("/logs", params=params)
    assert answer.status_code == 422
    assert says in answer.json()["detail"]


async def test_a_bad_last_event_id_is_422(api: Api) -> None:
    answer = await api.client.get("/logs/tail", headers={"Last-Event-ID": "abc"})
    assert answer.status_code == 422 and "Last-Event-ID" in answer.json()["detail"]
    answer = await api.client.get("/logs/tail", params={"level": "loud"})
    assert answer.status_code == 422


async def test_the_openapi_document_describes_logs(api: Api) -> None:
    doc = (await api.client.get("/openapi.json")).json()
    assert "LogLines" in doc["components"]["schemas"]
    tail = doc["paths"]["/logs/tail"]["get"]["responses"]["200"]["content"]
    data = tail["text/event-stream"]["itemSchema"]["properties"]["data"]
    assert data["contentSchema"]["$ref"] == "#/components/schemas/LogLineOut"
    assert "LogLineOut" in doc["components"]["schemas"]


# -- the live tail ----------------------------------------------------------------------
@dataclass
class Stream:
    """What a tail client read: events (id, data) and comments."""

    status: int = 0
    content_type: str = ""
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    connected: threading.Event = field(default_factory=threading.Event)


def read_stream(port: int, path: str, stream: Stream, *, events: int = 0, comments: int = 0,
                headers: dict[str, str] | None = None, timeout: float = 10.0) -> None:
    """Read ``path`` as an event stream until ``events`` events and ``comments`` comments
    (past the first) arrived; then hang up."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        stream.status = response.status
        stream.content_type = response.getheader("content-type") or ""
        current: dict[str, str] = {}
        while len(stream.events) < events or len(stream.comments) <= comments:
            raw = response.fp.readline()
            if not raw:
                return
            text = raw.decode("utf-8").rstrip("\r\n")
            if text.startswith(":"):
                stream.comments.append(text)
                stream.connected.set()
            elif text == "":
                if "data" in current:
                    stream.events.append((current.get("id", ""), json.loads(current["data"])))
                current = {}
            else:
                name, _, value = text.partition(":")
                current[name] = value.removeprefix(" ")
    finally:
        stream.connected.set()
        conn.close()


async def test_the_sse_tail_sends_lines_written_after_it_connected(
        tmp_path: Path, line: MakeLine, unique_name: str) -> None:
    config = make_config(tmp_path)
    writer = await LogService.open(config)  # another process writing to the same store
    try:
        await writer.write([line("old line", job="sse")])
        await writer.flush()
        with serve(create_app(config)) as port:
            stream = Stream()
            reader = asyncio.create_task(asyncio.to_thread(
                read_stream, port, "/logs/tail?job=sse&q=-noise", stream, events=3))
            assert await asyncio.to_thread(stream.connected.wait, 10)
            await writer.write([line("first new", job="sse", run="r1", task="t1"),
                                line("noise", job="sse"), line("other job", job="x")])
            await writer.flush()
            await writer.write([line("second new", job="sse")])
            await writer.flush()
            # the server's own crawlhub.* logs go to the same store (started plane)
            logging.getLogger(f"crawlhub.hub.{unique_name}").warning(
                "hub says hi", extra={"job": "sse"})
            await asyncio.wait_for(reader, 15)
        assert stream.status == 200 and stream.content_type.startswith("text/event-stream")
        messages = [data["message"] for _, data in stream.events]
        assert messages == ["first new", "second new", "hub says hi"]
        assert stream.events[2][1]["source"] == "hub"
        ids = [int(event_id) for event_id, _ in stream.events]
        assert ids == sorted(ids) and ids == [data["id"] for _, data in stream.events]
        assert stream.events[0][1]["run"] == "r1" and stream.events[0][1]["task"] == "t1"
        # resume after the first event: the EventSource's Last-Event-ID
        with serve(create_app(config)) as port:
            again = Stream()
            await asyncio.to_thread(read_stream, port, "/logs/tail?job=sse", again, events=2,
                                    headers={"Last-Event-ID": str(ids[0])})
        assert [data["message"] for _, data in again.events][:2] == [
            "noise", "second new"]
    finally:
        await writer.close()


async def test_the_sse_tail_sends_heartbeats_while_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("crawlhub.api.logs.HEARTBEAT", 0.2)
    config = make_config(tmp_path)
    with serve(create_app(config)) as port:
        stream = Stream()
        await asyncio.to_thread(read_stream, port, "/logs/tail", stream, comments=2)
    assert stream.comments.count(": keep-alive") == 2 and not stream.events

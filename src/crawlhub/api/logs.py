"""``/logs``: search the log store (every run's output and the logs of the hub, agents,
collectors and the center) and follow it live over Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field
from starlette.types import Receive, Scope, Send

from crawlhub.api import routing
from crawlhub.api.deps import ApiError, services
from crawlhub.api.openapi import BACKEND, errors
from crawlhub.api.throttle import client_of
from crawlhub.control.logs import LogQuery, LogQueryError, LogService, parse_when
from crawlhub.core.errors import NotFoundError
from crawlhub.services import Services

log = logging.getLogger("crawlhub.api")
router = routing.router(tags=["logs"])

#: Seconds without a line after which the tail sends a comment (proxies keep it open).
HEARTBEAT = 15.0
#: The longest wait for lines between two looks at the heartbeat clock.
_SLICE = 1.0


class LogLineOut(BaseModel):
    """One stored log line."""

    id: int = Field(description="the store's id: grows with every line; page with it")
    ts: float = Field(description="when the line was written, unix seconds")
    level: str = Field(description="debug, info, warning, error or critical")
    source: str = Field(description="job, build, hub, agent, collector, center or control")
    job: str | None = Field(None, description="the job's name, when known")
    run: str | None = Field(None, description="the run's code, when known")
    task: str | None = Field(None, description="the task's code, when known")
    host: str = Field("", description="the host that wrote it")
    stream: str | None = Field(None, description="stdout or stderr for a job's output")
    message: str = Field(description="the text (secrets masked, at most 16384 characters)")


class LogLines(BaseModel):
    """A page of lines, newest first (oldest first with ``after``); ``next`` is the
    ``before`` (with ``after``: the ``after``) of the next page, null on the last."""

    lines: list[LogLineOut]
    next: int | None = None


def log_service(svc: Services) -> LogService:
    """The log service of the app's control plane."""
    logs = getattr(svc.control, "logs", None) if svc.control is not None else None
    if logs is None:
        raise NotFoundError("this server has no log store: the control plane is not"
                            " running (start it with 'crawlhub serve')")
    return logs  # type: ignore[no-any-return]


_JOB = Query(None, max_length=200, description="only lines of this job")
_RUN = Query(None, max_length=200, description="only lines of this run")
_TASK = Query(None, max_length=200, description="only lines of this task")
_LEVEL = Query(None, max_length=20, description="the lowest level: warning finds warning,"
               " error and critical")
_SOURCE = Query(None, max_length=40, description="only lines from job, build, hub, agent,"
                " collector, center or control")
_Q = Query(None, max_length=1000, description='words (all must match), "a phrase",'
           " prefix*, -excluded; see docs/logs.md")


def make_query(**fields: Any) -> LogQuery:
    """A :class:`LogQuery`, or a 422 naming the parameter that is wrong."""
    try:
        for name in ("since", "until"):
            fields[name] = parse_when(fields.get(name), name=name)
        return LogQuery(**fields)
    except LogQueryError as exc:
        raise ApiError(422, str(exc)) from None


@router.get("/logs", summary="Search log lines", response_model=LogLines,
            responses=errors(404, 422, *BACKEND))
async def search_logs(
    job: str | None = _JOB, run: str | None = _RUN, task: str | None = _TASK,
    level: str | None = _LEVEL, source: str | None = _SOURCE, q: str | None = _Q,
    since: str | None = Query(None, max_length=64, description="lines at or after: unix"
                              " seconds, ISO 8601 (UTC without an offset) or an age (15m,"
                              " 2h, 7d)"),
    until: str | None = Query(None, max_length=64, description="lines before (like since)"),
    before: int | None = Query(None, ge=1, description="page back: lines with a smaller id"
                               " (the previous answer's next)"),
    after: int | None = Query(None, ge=0, description="read forward: lines with a greater"
                              " id, oldest first"),
    limit: int = Query(100, ge=1, le=1000, description="lines per page"),
    svc: Services = Depends(services),
) -> dict[str, Any]:
    """Lines matching every filter given, newest first, ``limit`` at a time; page back
    with ``before=<next>``. Search text never fails on its syntax: quotes, ``*``,
    ``-``, ``:`` or ``NEAR`` are read as described in ``q``."""
    logs = log_service(svc)
    query = make_query(job=job, run=run, task=task, level=level, source=source, q=q,
                       since=since, until=until, before=before, after=after, limit=limit)
    page = await logs.search(query)
    return {"lines": [line.to_dict() for line in page.lines], "next": page.next}


# OpenAPI 3.2's way (FastAPI's too): the schema of each event; ``data`` is a LogLineOut.
_SSE_ANSWER: dict[int | str, dict[str, Any]] = {200: {
    "description": "text/event-stream: one event per line, `id: <line id>` and `data:"
                   " <the line as JSON, like GET /logs>`; a comment every 15 s without"
                   " lines",
    "content": {"text/event-stream": {"itemSchema": {
        "type": "object",
        "properties": {
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"$ref": "#/components/schemas/LogLineOut"}},
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer", "minimum": 0},
        },
    }}},
}}


@router.get("/logs/tail", summary="Follow new log lines (Server-Sent Events)",
            response_class=StreamingResponse,
            responses={**_SSE_ANSWER, **errors(404, 422, 429, *BACKEND)})
async def tail_logs(
    request: Request,
    job: str | None = _JOB, run: str | None = _RUN, task: str | None = _TASK,
    level: str | None = _LEVEL, source: str | None = _SOURCE, q: str | None = _Q,
    after: int | None = Query(None, ge=0, description="start after this line id (default:"
                              " lines stored from now on)"),
    last_event_id: str | None = Header(None, alias="Last-Event-ID", max_length=40,
                                       description="sent by a reconnecting EventSource:"
                                       " resume after that line (wins over after)"),
    svc: Services = Depends(services),
) -> StreamingResponse:
    """Every new line matching the filters, oldest first, until the client goes away.
    An EventSource that reconnects sends ``Last-Event-ID`` and misses nothing."""
    logs = log_service(svc)
    query = make_query(job=job, run=run, task=task, level=level, source=source, q=q)
    if last_event_id is not None and last_event_id.strip():
        try:
            after = int(last_event_id.strip())
        except ValueError:
            raise ApiError(422, f"Last-Event-ID {last_event_id!r} is not a line id: send"
                           " the id of the last event received") from None
        if after < 0:
            raise ApiError(422, f"Last-Event-ID {after} is negative: line ids start at 1")
    start = await logs.store.last_id() if after is None else after
    tails: Tails = request.app.state.tails
    client = client_of(request.scope)
    refused = tails.refusal(client)
    if refused is not None:
        log.warning("refused a log tail for %s: %s", client, refused)
        raise ApiError(429, refused, retry_after=5)
    return _HeldStream(tails, client, _events(logs, query, start),
                       media_type="text/event-stream",
                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class Tails:
    """Open ``GET /logs/tail`` streams, counted per client address and in total: each
    costs a store search every 0.3 s, so past ``server.max_tails_per_client`` or
    ``server.max_tails`` a new one is refused (429) until one closes."""

    def __init__(self, *, per_client: int, total: int) -> None:
        self.per_client = per_client
        self.total = total
        self.open: dict[str, int] = {}

    def count(self) -> int:
        return sum(self.open.values())

    def refusal(self, client: str) -> str | None:
        """Why ``client`` may not open one more tail now (None: it may), and if it may,
        its tail is counted from now: :meth:`release` it when it ends."""
        if self.open.get(client, 0) >= self.per_client:
            return (f"{client} has {self.per_client} log tails open already"
                    " (server.max_tails_per_client): close one, or search with GET /logs")
        if self.count() >= self.total:
            return (f"{self.total} log tails are open already (server.max_tails): try again"
                    " when one closes, or search with GET /logs")
        self.open[client] = self.open.get(client, 0) + 1
        return None

    def release(self, client: str) -> None:
        left = self.open.get(client, 0) - 1
        if left > 0:
            self.open[client] = left
        else:
            self.open.pop(client, None)


class _HeldStream(StreamingResponse):
    """A tail that gives its place back however it ends: the client gone, the server
    stopping, or never started at all."""

    def __init__(self, tails: Tails, client: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tails, self.client = tails, client
        self.held = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.tails.release(self.client)

    def __del__(self) -> None:  # built but never sent (an error between): not leaked
        self.release()


async def _events(logs: LogService, query: LogQuery, cursor: int) -> AsyncIterator[bytes]:
    """The event stream; Starlette cancels it when the client disconnects. Cost: one
    store search per 0.3 s per open tail while nothing comes."""
    loop = asyncio.get_running_loop()
    yield b"retry: 3000\n: tail of crawlhub logs\n\n"
    quiet_since = loop.time()
    while True:
        lines = await logs.wait_lines(query, cursor, min(_SLICE, HEARTBEAT))
        if lines:
            chunks = []
            for line in lines:
                cursor = line.id if line.id is not None else cursor
                data = json.dumps(line.to_dict(), ensure_ascii=False)
                chunks.append(f"id: {line.id}\ndata: {data}\n\n")
            yield "".join(chunks).encode("utf-8")
            quiet_since = loop.time()
        elif loop.time() - quiet_since >= HEARTBEAT:
            yield b": keep-alive\n\n"
            quiet_since = loop.time()

"""The web page in a real browser: a crawlhub server (uvicorn on 127.0.0.1, a free port,
SQLite under a temp dir, ``server.token`` set, an outbound, a frontier and two agents so
every page has data) and headless Chromium driven by Playwright.

The browser is Debian's ``chromium`` (``/usr/bin/chromium``, or ``$CRAWLHUB_CHROMIUM``):
Playwright's own browser download is not used. Without it, or without the ``playwright``
package, every browser test FAILS and says how to install them (never a silent skip).

Every page test leaves a full-page screenshot in ``$CRAWLHUB_TEST_ARTIFACTS`` (default
``/tmp/crawlhub-web-artifacts``), and fails if the page logged a console error, threw,
had a request fail, or asked anything of a host other than 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from tests.servers import free_port

TOKEN = "web-test-token-8c1f2a9d"
#: An agent id full of markup: every page must show it as text.
HOSTILE_AGENT = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
CHROMIUM = os.environ.get("CRAWLHUB_CHROMIUM", "/usr/bin/chromium")
INSTALL = ("install the browser tests' needs: 'apt-get install chromium' (Debian's package,"
           " at /usr/bin/chromium, or set CRAWLHUB_CHROMIUM) and 'pip install -e .[dev]'"
           " (the playwright Python package; no 'playwright install' needed)")


def artifacts_dir() -> Path:
    path = Path(os.environ.get("CRAWLHUB_TEST_ARTIFACTS") or "/tmp/crawlhub-web-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


_shots: list[Path] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _shots:
        terminalreporter.write_line(
            f"web page screenshots ({len(_shots)}): {artifacts_dir()}")


# ---------------------------------------------------------------------------- server
@dataclass
class Server:
    """The crawlhub under test, running in a thread with its own event loop."""

    url: str
    app: Any
    loop: asyncio.AbstractEventLoop
    data_dir: Path
    #: lines the test's SSE endpoint (/test/tail) sends, fed by :meth:`tail`
    tail_lines: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    #: what the test's action endpoint has been asked
    actions: list[Any] = field(default_factory=list)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10) -> Any:
        """Run ``coro`` in the server's loop (its services live there)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def services(self) -> Any:
        return self.app.state.services

    def api(self, method: str, path: str, body: Any = None,
            token: str | None = TOKEN) -> tuple[int, Any]:
        """A JSON API call with the bearer token, as a script would make it."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def tail(self, line: dict[str, Any]) -> None:
        self.loop.call_soon_threadsafe(self.tail_lines.put_nowait, line)


def _config(data_dir: Path) -> Any:
    from crawlhub.config.schema import CrawlhubConfig

    return CrawlhubConfig.model_validate({
        "data_dir": str(data_dir),
        "storage": {"queues": f"sqlite:///{data_dir}/queues.db",
                    "state": f"sqlite:///{data_dir}/hub.db",
                    "frontier": f"sqlite:///{data_dir}/frontier.db"},
        "server": {"token": TOKEN},
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": "default", "init": {"key": "default"}, "frontier": "news"}],
        "frontier": {"news": {"segment": "1d", "expected_items": 10000}},
        "failure": {"path": str(data_dir / "failures.jsonl")},
    })


async def _seed(app: Any) -> None:
    """Two agents (one with a hostile id, one dead) so the agents page has rows."""
    from crawlhub.agents.registry import AgentInfo

    agents = app.state.services.agents
    now = time.time()
    await agents.register(AgentInfo(agent_id=HOSTILE_AGENT, host="127.0.0.1", pid=4242,
                                    version="test", queues=["default"], started=now,
                                    concurrency=8))
    await beat_hostile(app)
    await agents.register(AgentInfo(agent_id="agent-gone", host="127.0.0.1", pid=99,
                                    version="test", started=now - 300), at=now - 120)


async def beat_hostile(app: Any) -> None:
    """A heartbeat of the hostile agent: alive for the next seconds (the server lives the
    whole session, longer than an agent stays alive without one)."""
    from crawlhub.agents.registry import Heartbeat

    await app.state.services.agents.heartbeat(
        HOSTILE_AGENT, Heartbeat(memory=50 * 2**20, cpu=12.5, downloaders=3, in_flight=2,
                                 qps=4.5, pages=120, errors=1))


@contextmanager
def running_server(data_dir: Path) -> Iterator[Server]:
    """A crawlhub server on ``data_dir`` (the harness's config) in a thread of its own,
    stopped when the block ends; a second one on the same ``data_dir`` is the same
    server restarted."""
    import uvicorn

    from crawlhub.app.asgi import create_app

    app = create_app(_config(data_dir))
    port = free_port()
    loop = asyncio.new_event_loop()
    srv = Server(url=f"http://127.0.0.1:{port}", app=app, loop=loop, data_dir=data_dir)
    _test_routes(srv)
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                       access_log=False, lifespan="on"))

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(uv.serve())

    thread = threading.Thread(target=serve, name="crawlhub-web-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the crawlhub server for the web tests did not start")
        time.sleep(0.05)
    try:
        yield srv
    finally:
        uv.should_exit = True
        thread.join(30)
        loop.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("web")) as srv:
        srv.run(_seed(srv.app))
        status, answer = srv.api("POST", "/task/", [{"url": f"http://127.0.0.1/seed/{i}"}
                                                     for i in range(3)])
        assert status == 200, answer
        yield srv


def _test_routes(srv: Server) -> None:
    """Routes only the tests have: a page of every macro, an action endpoint that
    succeeds or refuses, and a small SSE log tail in the format of ``GET /logs/tail``."""
    from crawlhub.web.render import environment, fragment, page

    router = APIRouter(include_in_schema=False)
    macros_page = environment().from_string(MACROS_PAGE)
    macros_live = environment().from_string(MACROS_LIVE)

    def demo(request: Request) -> dict[str, Any]:
        t0 = time.time() - 60
        lines = [{"ts": t0 + 5 + i, "level": level, "source": "job", "job": "news",
                  "run": "r1", "task": "fetch", "message": text, "id": i + 1}
                 for i, (level, text) in enumerate([("info", "fetching page 1"),
                                                    ("warning", "<b>slow</b> answer"),
                                                    ("error", "gave up after 3 tries")])]
        tasks = [
            {"id": "fetch", "label": "fetch", "start": t0 + 5, "end": t0 + 30,
             "status": "success", "lines": lines},
            {"id": "parse", "label": "parse <items>", "start": t0 + 30, "end": None,
             "status": "running", "lines": []},
            {"id": "store", "label": "store", "start": t0 + 40, "end": t0 + 41,
             "status": "failed", "lines": []},
        ]
        return {"tasks": tasks, "t0": t0, "t1": time.time(), "done": len(srv.actions),
                "macros_live": macros_live}

    @router.get("/test/macros")
    async def macros(request: Request) -> HTMLResponse:
        return page(request, macros_page, area="test", title="Macros", **demo(request))

    @router.get("/test/macros/live")
    async def macros_fragment(request: Request) -> HTMLResponse:
        return fragment(request, macros_live, area="test", **demo(request))

    @router.post("/test/act")
    async def act(request: Request) -> JSONResponse:
        body = await request.json()
        srv.actions.append(body)
        return JSONResponse({"done": len(srv.actions)})

    @router.post("/test/refuse")
    async def refuse(request: Request) -> JSONResponse:
        return JSONResponse({"detail": "job 'news' is running already (max_instances 1)"},
                            status_code=409)

    @router.get("/test/tail")
    async def tail(request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            yield b"retry: 500\n\n"
            while True:
                line = await srv.tail_lines.get()
                yield f"id: {line['id']}\ndata: {json.dumps(line)}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    srv.app.include_router(router)


MACROS_LIVE = """{% from "macros.html" import live with context %}
{% call live("demo-live", "/test/macros/live") %}<p>actions done: <output id="done">{{ done }}</output></p>{% endcall %}"""

MACROS_PAGE = """{% extends "base.html" %}
{% from "macros.html" import badge, reltime, action, collapsible, timeline, log_view with context %}
{% block content %}
<h1>Macros</h1>
<p id="badges">{% for s in ("success", "running", "paused", "failed", "odd") %}{{ badge(s) }} {% endfor %} {{ reltime(t0) }}</p>
{% include macros_live %}
<p>{{ action("/test/act", "Run", refresh="#demo-live", vals={"n": 1, "why": "<b>test</b>"}) }}
   {{ action("/test/refuse", "Run again", tone="bad") }}</p>
{% call collapsible("More", id="more") %}<p id="more-body">folded text</p>{% endcall %}
<h2>Timeline</h2>
{% call(task) timeline(tasks, t0, t1) %}{{ log_view("log-" ~ task.id, lines=task.lines) }}{% endcall %}
<h2>Tail</h2>
{{ log_view("tail", tail="/test/tail", max_lines=50) }}
<h2>Tail of the log store</h2>
{{ log_view("store-tail", tail="/logs/tail?job=web-tail") }}
{% endblock %}"""


# ---------------------------------------------------------------------------- browser
@contextmanager
def launch_chromium(*args: str) -> Iterator[Any]:
    """Debian's Chromium (``CRAWLHUB_CHROMIUM``) through Playwright, headless, with ``args``;
    a missing package or browser fails the test saying how to install it."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(f"the playwright package is missing: {INSTALL}", pytrace=False)
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) \
            and not shutil.which(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: {INSTALL}", pytrace=False)
    if os.geteuid() == 0:
        args = (*args, "--no-sandbox")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=list(args))
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module: Playwright's sync API holds an event loop running
    in the main thread while it is open, so it must close before asyncio tests run."""
    with launch_chromium() as chromium:
        yield chromium


def login(browser: Any, server: Server) -> dict[str, Any]:
    """The browser storage of a login through the form on ``server``."""
    context = browser.new_context(base_url=server.url)
    try:
        page = context.new_page()
        page.goto("/login")
        page.fill("input[name=token]", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(server.url + "/")
        state: dict[str, Any] = context.storage_state()
        return state
    finally:
        context.close()


@pytest.fixture(scope="module")
def session_state(browser: Any, server: Server) -> dict[str, Any]:
    """The browser storage of a login through the form, shared by the page tests."""
    return login(browser, server)


@dataclass
class Watch:
    """What a page did wrong: console errors, uncaught exceptions, failed requests,
    requests to other hosts. A test that provokes an error on purpose ``allow``s it."""

    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    allowed: list[re.Pattern[str]] = field(default_factory=list)

    def allow(self, pattern: str) -> None:
        """Console errors matching ``pattern`` (a regex) are expected."""
        self.allowed.append(re.compile(pattern))

    def problems(self) -> list[str]:
        console = [c for c in self.console if not any(p.search(c) for p in self.allowed)]
        return ([f"console: {c}" for c in console] + [f"page error: {e}" for e in self.errors]
                + [f"failed request: {f}" for f in self.failed]
                + [f"request to another host: {u}" for u in self.foreign])


def _watch(page: Any, watch: Watch) -> None:
    def on_console(message: Any) -> None:
        if message.type == "error":
            watch.console.append(f"{message.text} ({message.location.get('url', '')})")

    def on_request(request: Any) -> None:
        watch.requests.append(request.url)
        host = urlsplit(request.url).hostname
        if request.url.startswith(("data:", "blob:", "about:")):
            return
        if host != "127.0.0.1":
            watch.foreign.append(request.url)

    def on_failed(request: Any) -> None:
        reason = request.failure or ""
        # a poll or a tail cut short by leaving the page is not a failure
        if "ERR_ABORTED" in reason and request.resource_type in ("xhr", "fetch",
                                                                  "eventsource"):
            return
        # nor the page's icon, whose load the browser drops when the page goes on
        if "ERR_ABORTED" in reason and urlsplit(request.url).path.endswith("favicon.svg"):
            return
        watch.failed.append(f"{request.method} {request.url}: {reason}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: watch.errors.append(str(error)))
    page.on("request", on_request)
    page.on("requestfailed", on_failed)


def _shot_name(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:120]


@pytest.fixture
def watch() -> Watch:
    return Watch()


@pytest.fixture
def shoot(request: pytest.FixtureRequest) -> Any:
    """``shoot(page, "agents")``: a screenshot now, ``<test>-agents.png`` (besides the
    one every page test leaves when it ends)."""

    def take(page: Any, label: str) -> Path:
        shot = artifacts_dir() / f"{_shot_name(request)}-{label}.png"
        page.screenshot(path=str(shot), full_page=True)
        _shots.append(shot)
        return shot

    return take


@pytest.fixture
def page(browser: Any, server: Server, session_state: dict[str, Any], watch: Watch,
         request: pytest.FixtureRequest) -> Iterator[Any]:
    """A logged-in page on the server; screenshot and checks when the test ends."""
    yield from _page(browser, server, watch, request, session_state)


@pytest.fixture
def anonymous_page(browser: Any, server: Server, watch: Watch,
                   request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page with no session cookie."""
    yield from _page(browser, server, watch, request, None)


def _page(browser: Any, server: Server, watch: Watch, request: pytest.FixtureRequest,
          state: dict[str, Any] | None) -> Iterator[Any]:
    context = browser.new_context(base_url=server.url, storage_state=state,
                                  viewport={"width": 1280, "height": 860})
    context.set_default_timeout(8000)
    page = context.new_page()
    _watch(page, watch)
    try:
        yield page
        shot = artifacts_dir() / f"{_shot_name(request)}.png"
        page.screenshot(path=str(shot), full_page=True)
        _shots.append(shot)
        problems = watch.problems()
        assert not problems, "the page misbehaved:\n" + "\n".join(problems)
    finally:
        context.close()

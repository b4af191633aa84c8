"""The web page's routes without a browser: status codes, the login and its cookie, the
CSRF rule, the security headers, escaping, keyset paging and the rendering helpers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx2
import pytest

from crawlhub.agents.registry import AgentInfo, Heartbeat
from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.services import Services
from crawlhub.web import session
from crawlhub.web.paging import keyset
from crawlhub.web.queues import RateMeter
from crawlhub.web.render import CSP, ago, duration, span, tone

TOKEN = "route-test-token-4e7b"
PAGES = ["/", "/ui/agents", "/ui/queues", "/ui/frontier"]
FRAGMENTS = ["/ui/overview/live", "/ui/agents/live", "/ui/queues/live", "/ui/frontier/live"]
HTML = {"Accept": "text/html,application/xhtml+xml"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

Web = Callable[..., Awaitable[tuple[httpx2.AsyncClient, Services]]]


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Web]:
    """``await web(token=...)``: the app on SQLite with an outbound and a frontier."""
    opened: list[tuple[httpx2.AsyncClient, Services]] = []

    async def make(token: str | None = None) -> tuple[httpx2.AsyncClient, Services]:
        d = tmp_path / f"app{len(opened)}"
        cfg = CrawlhubConfig.model_validate({
            "data_dir": str(d),
            "storage": {"queues": f"sqlite:///{d}/q.db", "state": f"sqlite:///{d}/h.db",
                        "frontier": f"sqlite:///{d}/f.db"},
            "server": {"token": token},
            "inbound": [{"name": "http", "class": "http"}],
            "outbound": [{"name": "default", "init": {"key": "default"}}],
            "frontier": {"news": {}},
            "failure": {"path": str(d / "failures.jsonl")},
        })
        svc = await Services.open(cfg)
        client = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=create_app(services=svc),
                                           raise_app_exceptions=False),
            base_url="http://crawlhub.test")
        opened.append((client, svc))
        return client, svc

    yield make
    for client, svc in opened:
        await client.aclose()
        await svc.close()


async def login(client: httpx2.AsyncClient, token: str = TOKEN) -> str:
    r = await client.post("/login", content=f"token={token}&next=/ui/agents", headers=FORM)
    assert r.status_code == 303, r.text
    return r.cookies[session.COOKIE]


# ------------------------------------------------------------------ pages, headers
@pytest.mark.parametrize("path", PAGES + FRAGMENTS)
async def test_every_page_and_fragment_answers_html_under_the_csp(web: Web, path: str) -> None:
    client, _ = await web()
    r = await client.get(path, headers=HTML)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "'unsafe-eval'" not in CSP
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["cache-control"] == "no-store"
    assert "<script>" not in r.text and " style=" not in r.text and "http" + "s://" not in r.text


async def test_the_page_names_only_its_own_static_files(web: Web) -> None:
    client, _ = await web()
    text = (await client.get("/")).text
    for asset in ("/static/web/crawlhub.css", "/static/web/htmx/htmx.min.js",
                  "/static/web/crawlhub.js", "/static/web/tail.js", "/static/web/favicon.svg"):
        assert f'"{asset}"' in text
        assert (await client.get(asset)).status_code == 200
    assert '"allowEval": false' in text


async def test_the_api_docs_health_and_json_answers_stay_as_they_were(web: Web) -> None:
    client, _ = await web()
    assert (await client.get("/healthz")).json()["status"] == "ok"
    assert (await client.get("/docs")).status_code == 200
    assert (await client.get("/agents/")).json()["agents"] == []
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p == "/" or p.startswith(("/ui", "/login", "/logout"))]


async def test_without_a_token_the_login_page_leads_straight_to_the_pages(web: Web) -> None:
    client, _ = await web()
    r = await client.get("/login?next=/ui/queues")
    assert (r.status_code, r.headers["location"]) == (303, "/ui/queues")
    assert "no server.token is set" in (await client.get("/")).text


async def test_names_with_markup_are_escaped(web: Web) -> None:
    client, svc = await web()
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    await svc.agents.register(AgentInfo(agent_id=hostile, host="<b>h</b>", pid=1,
                                        version="1", queues=["<i>q</i>"]))
    await svc.agents.heartbeat(hostile, Heartbeat(qps=1.5))
    text = (await client.get("/ui/agents")).text
    assert hostile not in text and "<b>h</b>" not in text and "<i>q</i>" not in text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" \
        in text


# ------------------------------------------------------------------ the token
async def test_with_a_token_a_browser_goes_to_the_login_and_a_script_gets_401(web: Web) -> None:
    client, _ = await web(TOKEN)
    r = await client.get("/ui/queues?q_after=x", headers=HTML)
    assert (r.status_code, r.headers["location"]) == (
        303, "/login?next=/ui/queues%3Fq_after%3Dx")
    r = await client.get("/ui/queues/live")
    assert r.status_code == 401 and "bearer token" in r.json()["detail"]
    r = await client.get("/outbound/")
    assert r.status_code == 401
    # htmx polling after the session ran out: sent to the login, back to its page after
    r = await client.get("/ui/queues/live", headers={
        "HX-Request": "true", "HX-Current-URL": "http://crawlhub.test/ui/queues?out_after=a"})
    assert r.status_code == 401
    assert r.headers["hx-redirect"] == "/login?next=/ui/queues%3Fout_after%3Da"
    for public in ("/login", "/healthz", "/static/web/crawlhub.css", "/docs"):
        assert (await client.get(public, headers=HTML)).status_code == 200, public


async def test_the_login_sets_an_httponly_strict_cookie_that_is_not_the_token(web: Web) -> None:
    client, _ = await web(TOKEN)
    r = await client.post("/login", content=f"token={TOKEN}&next=/ui/frontier", headers=FORM)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/frontier")
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert TOKEN not in cookie
    for path in PAGES + FRAGMENTS:
        assert (await client.get(path)).status_code == 200, path
    assert (await client.get("/outbound/")).status_code == 200  # the API reads it too


@pytest.mark.parametrize("given", ["", "nope", TOKEN + "x", TOKEN[:-1]])
async def test_a_wrong_token_is_refused_and_sets_no_cookie(web: Web, given: str) -> None:
    client, _ = await web(TOKEN)
    r = await client.post("/login", content=f"token={given}", headers=FORM)
    assert r.status_code == 401 and "wrong token" in r.text
    assert session.COOKIE not in r.cookies
    assert (await client.get("/ui/agents", headers=HTML)).status_code == 303


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/",
                                    "/\\evil.example", "javascript:alert(1)"])
async def test_the_login_never_sends_a_browser_to_another_site(web: Web, target: str) -> None:
    client, _ = await web(TOKEN)
    r = await client.post("/login", content=f"token={TOKEN}&next={target}", headers=FORM)
    assert (r.status_code, r.headers["location"]) == (303, "/")


async def test_a_login_form_posted_from_another_site_is_refused(web: Web) -> None:
    client, _ = await web(TOKEN)
    r = await client.post("/login", content=f"token={TOKEN}",
                          headers={**FORM, "Origin": "http://evil.example"})
    assert r.status_code == 403 and session.COOKIE not in r.cookies
    r = await client.post("/login", content=f"token={TOKEN}",
                          headers={**FORM, "Origin": "http://crawlhub.test"})
    assert r.status_code == 303


async def test_a_post_with_the_cookie_alone_needs_the_csrf_header(web: Web) -> None:
    client, svc = await web(TOKEN)
    await login(client)
    task = {"url": "http://127.0.0.1/a"}
    r = await client.post("/task/", json=task)
    assert r.status_code == 403 and "CSRF" in r.json()["detail"]
    assert await svc.queues.queue("default").length() == 0
    for header in ({"HX-Request": "true"}, {"X-Crawlhub-CSRF": "1"}):
        assert (await client.post("/task/", json=task, headers=header)).status_code == 200
    # the bearer token needs no CSRF header: a script is not a browser
    client.cookies.clear()
    r = await client.post("/task/", json=task, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    assert await svc.queues.queue("default").length() == 3


@pytest.mark.parametrize("value", ["", "garbage", "99999999999.abc", "1.00",
                                   "-5.abc", "1" * 20 + ".x"])
async def test_a_forged_cookie_is_no_session(web: Web, value: str) -> None:
    client, _ = await web(TOKEN)
    client.cookies.set(session.COOKIE, value)
    assert (await client.get("/ui/agents", headers=HTML)).status_code == 303


async def test_a_cookie_of_another_token_or_run_out_is_no_session(web: Web) -> None:
    client, _ = await web(TOKEN)
    client.cookies.set(session.COOKIE, session.issue("another-token"))
    assert (await client.get("/ui/agents", headers=HTML)).status_code == 303
    client.cookies.set(session.COOKIE, session.issue(TOKEN, now=time.time()
                                                     - session.SESSION_SECONDS - 1))
    assert (await client.get("/ui/agents", headers=HTML)).status_code == 303
    client.cookies.set(session.COOKIE, session.issue(TOKEN))
    assert (await client.get("/ui/agents", headers=HTML)).status_code == 200


async def test_log_out_drops_the_cookie(web: Web) -> None:
    client, _ = await web(TOKEN)
    await login(client)
    assert (await client.post("/logout")).status_code == 403  # no CSRF header
    r = await client.post("/logout", headers={"HX-Request": "true"})
    assert (r.status_code, r.headers["hx-redirect"]) == (204, "/login")
    assert f'{session.COOKIE}=""' in r.headers["set-cookie"]
    assert (await client.get("/ui/agents", headers=HTML)).status_code == 303


# ------------------------------------------------------------------ data and paging
async def test_the_queues_page_shows_left_total_success_failed(web: Web) -> None:
    client, svc = await web()
    for i in range(3):
        await client.post("/task/", json={"url": f"http://127.0.0.1/{i}"})
    queue = svc.queues.queue("default")
    leased = await queue.lease(1, 60)
    await queue.ack([leased[0].id])
    text = (await client.get("/ui/queues/live")).text
    row = text.split('<tr data-key="default">')[2].split("</tr>")[0]  # the queues table
    cells = [c.split(">", 1)[1].split("<", 1)[0] for c in row.split("<td")[1:]]
    assert cells[1:9] == ["2", "2", "0", "3", "1", "0", "0", "0"]


async def test_long_lists_are_paged_by_key(web: Web) -> None:
    client, svc = await web()
    for i in range(120):
        await svc.agents.register(AgentInfo(agent_id=f"agent-{i:03}", host="h", pid=i,
                                            version="1"))
    def rows(text: str) -> list[str]:
        return [part.split('"', 1)[0] for part in text.split('data-key="')[1:]]

    first = (await client.get("/ui/agents")).text
    assert rows(first) == [f"agent-{i:03}" for i in range(50)]
    assert 'href="?after=agent-049"' in first and "1–50 of 120" in first
    second = (await client.get("/ui/agents?after=agent-049")).text
    assert rows(second) == [f"agent-{i:03}" for i in range(50, 100)]
    assert 'href="?before=agent-050"' in second and 'href="?after=agent-099"' in second
    assert 'hx-get="/ui/agents/live?after=agent-049"' in second  # polls the same page
    back = (await client.get("/ui/agents?before=agent-050")).text
    assert rows(back) == rows(first)
    dead = (await client.get("/ui/agents?show=dead")).text
    assert "no agent has registered" in dead
    ten = (await client.get("/ui/agents?limit=10")).text
    assert rows(ten) == [f"agent-{i:03}" for i in range(10)]


@pytest.mark.parametrize("limit", ["abc", "-5", "0", "99999", ""])
async def test_a_hand_edited_page_size_never_fails_a_page(web: Web, limit: str) -> None:
    client, _ = await web()
    for path in PAGES + FRAGMENTS:
        r = await client.get(f"{path}?limit={limit}", headers=HTML)
        assert r.status_code == 200, (path, r.text[:300])


def test_keyset_pages_forward_backward_and_newest_first() -> None:
    items = list(range(1, 11))
    page = keyset(items, lambda i: i, limit=4)
    assert (page.rows, page.prev, page.next) == ([1, 2, 3, 4], None, "4")
    page = keyset(items, lambda i: i, after="4", limit=4, parse=int)
    assert (page.rows, page.prev, page.next) == ([5, 6, 7, 8], "5", "8")
    page = keyset(items, lambda i: i, after="8", limit=4, parse=int)
    assert (page.rows, page.prev, page.next) == ([9, 10], "9", None)
    page = keyset(items, lambda i: i, before="5", limit=4, parse=int)
    assert (page.rows, page.prev, page.next) == ([1, 2, 3, 4], None, "4")
    newest = keyset(items, lambda i: i, limit=3, descending=True, parse=int)
    assert (newest.rows, newest.next) == ([10, 9, 8], "8")
    older = keyset(items, lambda i: i, after="8", limit=3, descending=True, parse=int)
    assert (older.rows, older.prev, older.next) == ([7, 6, 5], "7", "5")
    newer = keyset(items, lambda i: i, before="7", limit=3, descending=True, parse=int)
    assert (newer.rows, newer.prev) == ([10, 9, 8], None)
    # a cursor whose row went away still pages from where it was; a bad one: page one
    assert keyset([1, 3, 5], lambda i: i, after="2", limit=5, parse=int).rows == [3, 5]
    assert keyset(items, lambda i: i, after="x", limit=2, parse=int).rows == [1, 2]


def test_the_queue_rate_is_measured_between_looks() -> None:
    now = [100.0]
    meter = RateMeter(window=30, clock=lambda: now[0])
    assert meter.rate("q", 10) is None  # one look: no rate yet
    now[0] += 2
    assert meter.rate("q", 30) == pytest.approx(10.0)
    now[0] += 40
    meter.rate("q", 30)
    now[0] += 2
    assert meter.rate("q", 50) == pytest.approx(10.0)  # the old looks left the window


def test_times_bars_and_tones_render_for_people() -> None:
    assert ago(1000.0, now=1012.0) == "12 s ago"
    assert ago(1000.0, now=1000.0 + 3 * 3600 + 5) == "3 h ago"
    assert ago(2000.0, now=1940.0) == "in 1 min"
    assert ago(None) == "-"
    assert duration(0.25) == "250 ms" and duration(185) == "3 min 5 s"
    assert duration(90000) == "1 d 1 h"
    assert span(10, 20, 0, 100) == (10.0, 10.0)
    assert span(50, 50, 0, 100) == (50.0, 0.5)  # an instant still shows
    assert span(90, None, 0, 100, now=200) == (90.0, 10.0)  # running: up to now, clipped
    assert tone("FAILED") == "bad" and tone("running") == "busy" and tone("?") == "info"


def test_safe_next_keeps_paths_on_this_server() -> None:
    assert session.safe_next("/ui/runs?job=a") == "/ui/runs?job=a"
    for bad in (None, "", "//x", "/\\x", "http://x/", "x", "/a\r\nSet-Cookie: y"):
        assert session.safe_next(bad) == "/"

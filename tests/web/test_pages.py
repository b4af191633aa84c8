"""The web page end to end in headless Chromium: every page loads clean (no console
error, no failed request, nothing asked of another host), the token guards it, pages
update live, and the macros the control plane's pages build on work in a browser."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from .conftest import HOSTILE_AGENT, TOKEN, Server, Watch, beat_hostile

PAGES = [("/", "Overview"), ("/ui/agents", "Agents"), ("/ui/queues", "Outbounds and queues"),
         ("/ui/frontier", "Frontier")]


def test_every_page_in_the_nav_loads_clean_and_shows_its_data(page: Any, server: Server,
                                                              watch: Watch,
                                                              shoot: Any) -> None:
    page.goto("/")
    nav = [(a.get_attribute("href"), a.inner_text())
           for a in page.locator("nav.areas a").all()]
    assert nav[:4] == [("/", "Overview"), ("/ui/agents", "Agents"), ("/ui/queues", "Queues"),
                       ("/ui/frontier", "Frontier")]  # the control plane's pages follow
    for path, heading in PAGES:
        page.goto(path)
        expect(page.locator("h1")).to_have_text(heading)
        expect(page.locator("nav.areas a[aria-current=page]")).to_have_attribute(
            "href", path)
        # the live block's fragment answers and is swapped in (as every 2 s)
        with page.expect_response(re.compile(r"/live")) as answer:
            page.locator(".live").first.dispatch_event("refresh")
        assert answer.value.status == 200
        shoot(page, heading.split()[0].lower())
    server.run(beat_hostile(server.app))  # minutes may have passed since the server began
    page.goto("/ui/agents")
    row = page.locator("#agents tr", has=page.get_by_text(HOSTILE_AGENT, exact=True))
    expect(row).to_have_count(1)  # the markup shows as text and ran nowhere
    expect(row.locator(".badge")).to_have_text("alive")
    expect(page.locator("#agents tr[data-key=agent-gone] .badge")).to_have_text("dead")
    assert page.evaluate("window.__xss") is None
    page.goto("/ui/frontier")
    expect(page.locator("#frontiers tr[data-key=news] td").nth(3)).not_to_have_text("0")
    expect(page.locator("#segments tbody tr")).to_have_count(1)  # today's segment
    assert all(url.startswith(server.url + "/") for url in watch.requests), watch.requests


def test_without_a_session_a_browser_is_sent_to_the_login_and_a_wrong_token_is_refused(
        anonymous_page: Any, server: Server, watch: Watch) -> None:
    page = anonymous_page
    watch.allow(r"status of 401")  # the wrong token's answer
    page.goto("/ui/queues?q_after=a")
    assert page.url == server.url + "/login?next=/ui/queues%3Fq_after%3Da"
    page.fill("input[name=token]", TOKEN + "-wrong")
    page.click("button[type=submit]")
    expect(page.locator(".problem")).to_contain_text("wrong token")
    assert page.context.cookies() == []
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/ui/queues?q_after=a")
    expect(page.locator("h1")).to_have_text("Outbounds and queues")
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert TOKEN not in cookie["value"]


def test_a_post_with_the_cookie_alone_needs_the_csrf_header(page: Any, server: Server,
                                                             watch: Watch) -> None:
    watch.allow(r"status of 403")
    page.goto("/")
    post = """(headers) => fetch('/task/', {method: 'POST', body: '{"url": "http://127.0.0.1/csrf"}',
        headers: Object.assign({'Content-Type': 'application/json'}, headers)})
        .then(async r => [r.status, await r.text()])"""
    status, text = page.evaluate(post, {})
    assert status == 403 and "CSRF" in text
    status, _ = page.evaluate(post, {"X-Crawlhub-CSRF": "1"})
    assert status == 200


def test_the_queues_page_shows_a_new_task_without_a_reload(page: Any, server: Server) -> None:
    page.goto("/ui/queues")
    page.evaluate("window.__loaded_once = true")
    left = server.run(server.services.queues.queue("default").length())
    status, answer = server.api("POST", "/task/", {"url": "http://127.0.0.1/live-1"})
    assert status == 200 and answer["outbound"] == "default"
    cell = page.locator("#queues tr[data-key=default] [data-col=left]")
    expect(cell).to_have_text(str(left + 1))
    expect(page.locator("#outbounds tr[data-key=default] [data-col=left]")).to_have_text(
        str(left + 1))
    assert page.evaluate("window.__loaded_once") is True  # swapped in, not reloaded


def test_action_buttons_post_json_refresh_and_show_the_apis_error(page: Any, server: Server,
                                                                  watch: Watch) -> None:
    watch.allow(r"status of 409|Response Status Error Code 409")  # the refusal, on purpose
    page.goto("/test/macros")
    done = page.locator("#done")
    before = int(done.inner_text())
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.locator("#flash")).to_have_text("Run: done")
    expect(done).to_have_text(str(before + 1))  # refreshed at once via data-refresh
    assert server.actions[-1] == {"n": 1, "why": "<b>test</b>"}  # JSON with its types
    page.get_by_role("button", name="Run again").click()
    expect(page.locator("#flash")).to_have_text(
        "Run again failed: job 'news' is running already (max_instances 1)")
    expect(page.locator("#flash")).to_have_class(re.compile("tone-bad"))


def test_timeline_rows_fold_open_onto_their_log(page: Any) -> None:
    page.goto("/test/macros")
    rows = page.locator(".timeline details.tl-row")
    expect(rows).to_have_count(3)
    expect(rows.nth(1).locator(".tl-label")).to_have_text("parse <items>")
    bar = rows.nth(0).locator("rect.tl-bar")
    assert float(bar.get_attribute("x").rstrip("%")) > 0
    assert "tone-good" in bar.get_attribute("class")
    log = page.locator("#log-fetch")
    expect(log).to_be_hidden()
    rows.nth(0).locator("summary").click()
    expect(log.locator(".log-line")).to_have_count(3)
    expect(log.locator(".log-line.lvl-warning .msg")).to_have_text("<b>slow</b> answer")
    # a live swap elsewhere on the page leaves it open
    page.locator("#demo-live").dispatch_event("refresh")
    page.wait_for_timeout(300)
    expect(log).to_be_visible()


def test_the_log_tail_appends_lines_live_pauses_and_continues(page: Any,
                                                              server: Server) -> None:
    page.goto("/test/macros")
    view = page.locator("#tail")
    state = view.locator(".tail-state")
    expect(state).to_have_text("live")
    line = {"ts": 1_700_000_000.25, "level": "info", "source": "job", "job": "news",
            "run": "r7", "task": "fetch", "host": "", "stream": "stdout"}
    server.tail({**line, "id": 1, "message": "page 1 fetched"})
    server.tail({**line, "id": 2, "level": "error",
                 "message": '<img src=x onerror="window.__xss=3">'})
    server.tail({**line, "id": 2, "message": "a repeated id is shown once"})
    lines = view.locator(".log-line")
    expect(lines).to_have_count(2)
    expect(lines.nth(0).locator(".msg")).to_have_text("page 1 fetched")
    expect(lines.nth(0).locator(".codes")).to_have_text("news/r7/fetch")
    expect(lines.nth(0).locator("time")).to_have_text("22:13:20.250")
    expect(lines.nth(1)).to_have_class(re.compile("lvl-error"))
    expect(lines.nth(1).locator(".msg")).to_have_text('<img src=x onerror="window.__xss=3">')
    view.get_by_role("button", name="Pause").click()
    server.tail({**line, "id": 3, "message": "while paused"})
    expect(state).to_have_text("paused, 1 new")
    expect(lines).to_have_count(2)
    view.get_by_role("button", name="Continue").click()
    expect(lines).to_have_count(3)
    expect(lines.nth(2).locator(".msg")).to_have_text("while paused")
    assert page.evaluate("window.__xss") is None


def test_log_out_drops_the_session(page: Any, server: Server) -> None:
    page.goto("/ui/agents")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(re.compile(r"/login$"))
    assert page.context.cookies() == []
    page.goto("/ui/agents")
    assert page.url == server.url + "/login?next=/ui/agents"


def test_the_log_view_tails_the_log_stores_sse_endpoint(page: Any, server: Server) -> None:
    from crawlhub.control.logs.line import LogLine

    page.goto("/test/macros")
    view = page.locator("#store-tail")
    expect(view.locator(".tail-state")).to_have_text("live")
    lines = [LogLine(ts=1_700_000_000.0 + i, message=f"stored line {i}", level="info",
                     source="job", job="web-tail", run="r1", task="t1") for i in range(3)]
    lines.append(LogLine(ts=1_700_000_009.0, message="another job's line", job="other"))
    server.run(server.services.control.logs.write(lines))
    expect(view.locator(".log-line .msg")).to_have_text(
        ["stored line 0", "stored line 1", "stored line 2"])
    expect(view.locator(".log-line .codes").first).to_have_text("web-tail/r1/t1")


def test_a_page_whose_session_ran_out_goes_to_the_login_at_its_next_update(
        page: Any, server: Server, watch: Watch) -> None:
    watch.allow(r"status of 401|Response Status Error Code 401")
    page.goto("/ui/queues?q_after=a")
    page.wait_for_selector("#queues-charts figure.chart")  # the page's own loads are done
    page.context.clear_cookies()  # as if the session had run out
    # the next update: this refresh, or the 2 s poll when a loaded machine is slower
    # (then the page is on its way to the login already, and this finds nothing)
    with contextlib.suppress(PlaywrightError):
        page.evaluate("document.querySelector('#queues-live')"
                      "?.dispatchEvent(new Event('refresh'))")
    page.wait_for_url(server.url + "/login?next=/ui/queues%3Fq_after%3Da")

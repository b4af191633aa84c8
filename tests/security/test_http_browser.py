"""A real browser (Debian's Chromium, headless) on a hostile page: from another local
origin, and by DNS rebinding, the page can neither start a job on a no-token server nor
read an API answer. What a page can do is everything a form, a no-cors fetch and a
same-origin fetch after rebinding can do; all of it is tried."""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.servers import free_port
from tests.web.conftest import launch_chromium

from .http_live import config, live

REBIND = "rebind.evil.example"

#: The hostile page: every way to post that needs no CORS preflight, one that does, and a
#: read; what happened goes to window.__results.
ATTACK = """<!doctype html><meta charset=utf-8><title>cute cats</title>
<iframe name=sink></iframe>
<form id=f method=post action="API/jobs/marker/run" target=sink></form>
<form id=g method=post action="API/task/" enctype=text/plain target=sink2>
  <input name='{"url": "http://127.0.0.1/form", "x": "' value='"}'></form>
<iframe name=sink2></iframe>
<script>
(async () => {
  const api = "API", r = {};
  const loaded = (name) => new Promise((done) => { document.querySelector(
    `iframe[name=${name}]`).onload = done; setTimeout(done, 5000); });
  const posted = Promise.all([loaded('sink'), loaded('sink2')]);
  document.getElementById('f').submit();
  document.getElementById('g').submit();
  await posted;
  const job = JSON.stringify({name: 'evil', command: EVIL});
  const tries = [
    ['run', api + '/jobs/marker/run', {method: 'POST', mode: 'no-cors'}],
    ['pause', api + '/jobs/marker/pause', {method: 'POST', mode: 'no-cors'}],
    ['create', api + '/jobs/', {method: 'POST', mode: 'no-cors', body: job,
                                headers: {'Content-Type': 'text/plain'}}],
    ['blob', api + '/jobs/', {method: 'POST', mode: 'no-cors', body: new Blob([job])}],
    ['task', api + '/task/', {method: 'POST', mode: 'no-cors',
                              body: '{"url": "http://127.0.0.1/text"}'}],
    ['json', api + '/jobs/', {method: 'POST', body: job,
                              headers: {'Content-Type': 'application/json'}}],
  ];
  for (const [name, url, init] of tries) {
    try { const a = await fetch(url, init); r[name] = a.status; }
    catch (e) { r[name] = 'error: ' + e; }
  }
  for (const path of ['/jobs/', '/runs/', '/healthz']) {
    try { const a = await fetch(api + path); r['read ' + path] = a.status + ' ' + await a.text(); }
    catch (e) { r['read ' + path] = 'error: ' + e; }
  }
  window.__results = r;
})();
</script>"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # the rebinding name resolves to this machine, as the attacker's DNS makes it
    # and the page counts as public: Chromium's own guard (Local Network Access) would
    # stop it before it reaches crawlhub; it is off here, as in browsers without one
    with launch_chromium(
            f"--host-resolver-rules=MAP {REBIND} 127.0.0.1",
            "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,"
            "PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults",
    ) as chromium:
        yield chromium


def attack_page(api: str, marker: Path) -> str:
    evil = json.dumps([sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"])
    return ATTACK.replace("API", api).replace("EVIL", evil)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Any, Path]]:
    """A no-token server with one job, ``marker``, whose run would leave a file."""
    marker = tmp_path / "ran"
    with live(config(tmp_path)) as (url, app):
        job = {"name": "marker",
               "command": [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"]}
        request = urllib.request.Request(f"{url}/jobs/", data=json.dumps(job).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 201
        yield url, app, marker


def script_get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def nothing_happened(url: str, marker: Path) -> None:
    assert [j["name"] for j in script_get(f"{url}/jobs/")] == ["marker"]
    assert script_get(f"{url}/runs/?job=marker") == []
    assert all(q["total"] == 0 for q in script_get(f"{url}/queues/"))  # no task queued
    assert not marker.exists()


def results(page: Any) -> dict[str, Any]:
    page.wait_for_function("window.__results !== undefined", timeout=30_000)
    found: dict[str, Any] = page.evaluate("window.__results")
    return found


def test_a_page_on_another_local_origin_can_neither_start_a_job_nor_read_an_answer(
        browser: Any, server: tuple[str, Any, Path]) -> None:
    url, _, marker = server
    html = attack_page(url, marker).encode()

    class Attacker(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    # another port of 127.0.0.1: another origin, but the same *site* to the browser
    site = ThreadingHTTPServer(("127.0.0.1", free_port()), Attacker)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{site.server_port}/")
        found = results(page)
    finally:
        context.close()
        site.shutdown()
        site.server_close()
    for name in ("read /jobs/", "read /runs/", "read /healthz"):
        assert found[name].startswith("error"), found  # no CORS: the answer stays unread
    assert found["json"].startswith("error"), found  # its preflight is never granted
    nothing_happened(url, marker)


def test_a_rebinding_page_reaches_the_server_under_its_own_name_and_is_refused(
        browser: Any, server: tuple[str, Any, Path]) -> None:
    url, _, marker = server
    port = url.rsplit(":", 1)[1]
    origin = f"http://{REBIND}:{port}"
    context = browser.new_context()
    try:
        # the page comes from the attacker's server; then the name points at 127.0.0.1,
        # so the page's own-origin requests reach crawlhub, under Host: rebind.evil.example
        context.route(f"{origin}/attack", lambda route: route.fulfill(
            status=200, content_type="text/html", body=attack_page(origin, marker)))
        page = context.new_page()
        page.goto(f"{origin}/attack")
        found = results(page)
    finally:
        context.close()
    # same origin now: the page reads every answer, and every answer is the refusal
    for name in ("run", "pause", "create", "blob", "task", "json"):
        assert found[name] == 421, found
    for name in ("read /jobs/", "read /runs/", "read /healthz"):
        assert found[name].startswith("421 ") and "marker" not in found[name], found
    nothing_happened(url, marker)

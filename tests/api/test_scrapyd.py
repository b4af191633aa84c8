"""Scrapyd's API on ``crawlhub serve``, driven by Scrapyd's own clients from PyPI: a
project made by ``scrapy startproject`` is deployed with scrapyd-client's
``scrapyd-deploy``, then python-scrapyd-api lists, schedules and cancels its spider, which
crawls ``crawlhub demo``; its items and log come back from ``/items`` and ``/logs``. The
server has a token (taken as basic auth's password) and refuses cross-site and
DNS-rebinding requests; malformed input gets Scrapyd's error shape and changes nothing.

One server, one demo site and one deploy for the module (each costs seconds).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from scrapyd_api import ScrapydAPI
from scrapyd_api.exceptions import ScrapydResponseError
from scrapyd_client.pyclient import ScrapydClient
from typer.testing import CliRunner, Result

from crawlhub.cli import app as cli_app
from tests.cli.serving import Served, crawlhub_serve
from tests.demo.process import demo_process
from tests.helpers import wait_for
from tests.servers import free_port

TOKEN = "scrapyd-test-token-0123456789abcdef"
#: The spider the test adds to the project `scrapy startproject` made: a category of the
#: demo shop, its listing pages and its items.
SPIDER = '''import scrapy


class ItemsSpider(scrapy.Spider):
    name = "items"

    def __init__(self, start=None, category="books", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [f"{start}/category/{category}"]

    def parse(self, response):
        if "/item/" in response.url:
            yield {"url": response.url, "title": response.css("h1::text").get(),
                   "price": response.css("p.price::text").get()}
        for href in response.css("a.item::attr(href), a.next::attr(href)").getall():
            yield response.follow(href, self.parse)
'''


@dataclass
class Scrapyd:
    served: Served
    url: str
    demo: str
    egg: bytes
    #: how to start the server again: its arguments and its log
    serve_args: list[str]
    serve_log: Path

    def api(self, password: str = TOKEN) -> ScrapydAPI:
        """python-scrapyd-api's client (Gerapy's)."""
        return ScrapydAPI(self.url, auth=("anyone", password), timeout=60)

    def client(self) -> ScrapydClient:
        """scrapyd-client's own Python client."""
        return ScrapydClient(self.url, username="anyone", password=TOKEN)

    def get(self, path: str, headers: dict[str, str] | None = None,
            auth: bool = True) -> tuple[int, bytes]:
        return _call(f"{self.url}{path}", headers=headers, auth=auth)

    def post(self, path: str, form: dict[str, str], headers: dict[str, str] | None = None,
             auth: bool = True) -> tuple[int, bytes]:
        body = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in form.items()).encode()
        return _call(f"{self.url}{path}", body, {
            "Content-Type": "application/x-www-form-urlencoded", **(headers or {})}, auth)

    def main_api(self, path: str) -> Any:
        request = urllib.request.Request(f"{self.served.url}{path}",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.loads(resp.read())


def _call(url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
          auth: bool = True) -> tuple[int, bytes]:
    headers = dict(headers or {})
    if auth:
        basic = base64.b64encode(f"me:{TOKEN}".encode()).decode()
        headers.setdefault("Authorization", f"Basic {basic}")
    request = urllib.request.Request(url, data=body, headers=headers,
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _tool(name: str) -> str:
    script = Path(sys.executable).with_name(name)
    if not script.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: pip install"
                    " 'crawlhub[dev]' (scrapyd-client)")
    return str(script)


@pytest.fixture(scope="module")
def scrapyd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrapyd]:
    tmp = tmp_path_factory.mktemp("scrapyd")
    port = free_port()
    config = tmp / "crawlhub.yaml"
    # control.grace: the orphan a killed server left is stopped 2 s after its SIGTERM
    config.write_text(f"server:\n  token: {TOKEN}\ncontrol:\n  grace: 2\n"
                      f"scrapyd:\n  enabled: true\n  port: {port}\n  max_proc: 1\n")
    # the project as `scrapy startproject` leaves it, a spider added, scrapy.cfg's
    # [deploy] pointed at the server with the token as its password
    subprocess.run([sys.executable, "-m", "scrapy", "startproject", "shop",
                    str(tmp / "shop")], check=True, capture_output=True)
    (tmp / "shop/shop/spiders/items.py").write_text(SPIDER)
    cfg = tmp / "shop/scrapy.cfg"
    cfg.write_text(cfg.read_text() + f"\n[deploy:crawlhub]\nurl = http://127.0.0.1:{port}/\n"
                   f"project = shop\nusername = deployer\npassword = {TOKEN}\n")
    serve_args = ["--config", str(config), "--data-dir", str(tmp / "data")]
    with demo_process(log=tmp / "demo.log") as demo, \
            crawlhub_serve(serve_args, log=tmp / "serve.log") as served:
        deployed = subprocess.run([_tool("scrapyd-deploy"), "crawlhub", "--version", "1.0"],
                                  cwd=tmp / "shop", capture_output=True, text=True,
                                  timeout=120)
        assert deployed.returncode == 0, deployed.stderr + deployed.stdout
        answer = json.loads(deployed.stdout)
        assert answer == {"node_name": answer["node_name"], "status": "ok",
                          "project": "shop", "version": "1.0", "spiders": 1}, answer
        # the egg it uploaded, kept as the build's artifact, for the tests that upload again
        scrapyd = Scrapyd(served, f"http://127.0.0.1:{port}", demo, b"", serve_args,
                          tmp / "serve.log")
        [build] = scrapyd.main_api("/builds/?project=shop")["builds"]
        scrapyd.egg = Path(build["artifact_path"]).read_bytes()
        yield scrapyd


async def _finished(api: ScrapydAPI, project: str, jobid: str) -> None:
    async def done() -> bool:
        return await asyncio.to_thread(api.job_status, project, jobid) == "finished"

    await wait_for(done, f"job {jobid} to finish", timeout=120, every=0.3)


def test_scrapyd_deploy_makes_a_version_of_a_crawlhub_project_with_its_spiders(
        scrapyd: Scrapyd) -> None:
    api = scrapyd.api()
    assert "shop" in api.list_projects()
    assert api.list_versions("shop") == ["1.0"]
    assert api.list_spiders("shop") == ["items"]
    assert scrapyd.client().spiders("shop") == ["items"]
    # on crawlhub's side: a project without a git remote, and a build of the egg
    assert scrapyd.main_api("/projects/shop")["git_url"] == ""
    [build] = scrapyd.main_api("/builds/?project=shop")["builds"]
    assert (build["version"], build["status"], build["builder"], build["trigger"],
            build["artifact_kind"]) == ("1.0", "succeeded", "egg", "scrapyd", "egg")


async def test_a_scheduled_spider_crawls_the_demo_and_its_items_and_log_are_served(
        scrapyd: Scrapyd) -> None:
    api = scrapyd.api()
    jobid = await asyncio.to_thread(
        api.schedule, "shop", "items",
        # startproject's settings crawl one request a second; this crawl goes faster
        settings={"USER_AGENT": "scrapyd-test/1", "DOWNLOAD_DELAY": "0",
                  "CONCURRENT_REQUESTS_PER_DOMAIN": "8"},
        start=scrapyd.demo, category="music", _version="1.0")
    await _finished(api, "shop", jobid)

    listed = api.list_jobs("shop")
    [job] = [j for j in listed["finished"] if j["id"] == jobid]
    start = datetime.fromisoformat(job["start_time"])
    end = datetime.fromisoformat(job["end_time"])
    assert start <= end
    assert job["log_url"] == f"/logs/shop/items/{jobid}.log"

    status, body = scrapyd.get(job["items_url"])
    assert status == 200, body
    items = [json.loads(line) for line in body.decode().splitlines()]
    # the music shelf is items 25 to 48; the spider argument chose it
    numbers = {int(item["url"].split("/item/")[1].split("?")[0]) for item in items}
    assert numbers == set(range(25, 49))
    assert all(item["title"] and item["price"] for item in items)

    status, body = scrapyd.get(job["log_url"])
    text = body.decode()
    assert status == 200
    assert "Spider closed (finished)" in text
    assert "scrapyd-test/1" in text  # the setting= reached Scrapy ("Overridden settings")
    assert "'item_scraped_count'" in text

    # on crawlhub's side, the job is a run of the spider's job
    runs = scrapyd.main_api("/runs/?job=scrapyd.shop.items")
    assert any(run["trigger"] == "scrapyd" and run["status"] == "succeeded"
               for run in runs), runs


async def test_a_job_waits_pending_for_a_free_slot_and_cancel_drops_or_stops_it(
        scrapyd: Scrapyd) -> None:
    api = scrapyd.api()
    # a slow crawl (a request a second, ~30 s) holds the one slot (max_proc: 1)
    slow = await asyncio.to_thread(api.schedule, "shop", "items", start=scrapyd.demo,
                                   settings={"DOWNLOAD_DELAY": "1"}, jobid="slow-1")
    assert slow == "slow-1"
    async def running() -> bool:
        return await asyncio.to_thread(api.job_status, "shop", "slow-1") == "running"

    await wait_for(running, "the slow job to start", timeout=60, every=0.2)
    queued = await asyncio.to_thread(api.schedule, "shop", "items", start=scrapyd.demo,
                                     category="toys", priority="5")
    jobs = api.list_jobs("shop")
    assert [j["id"] for j in jobs["running"]] == ["slow-1"]
    [pending] = jobs["pending"]
    assert (pending["id"], pending["spider"], pending["args"]) == (
        queued, "items", {"start": scrapyd.demo, "category": "toys"})
    client = scrapyd.client()
    assert client.status(queued, "shop")["currstate"] == "pending"
    daemon = client.daemonstatus()
    assert (daemon["pending"], daemon["running"]) == (1, 1)
    assert scrapyd.get(f"/logs/shop/items/{queued}.log")[0] == 404  # no log before it runs

    assert api.cancel("shop", queued) == "pending"
    assert api.list_jobs("shop")["pending"] == []
    assert client.status(queued)["currstate"] is None

    assert api.cancel("shop", "slow-1") == "running"
    await _finished(api, "shop", "slow-1")
    assert api.cancel("shop", "slow-1") is None  # over: nothing to cancel
    assert client.status("slow-1", "shop")["currstate"] == "finished"
    runs = scrapyd.main_api("/runs/?job=scrapyd.shop.items")
    assert any(run["status"] == "cancelled" for run in runs), runs


def test_versions_and_projects_are_added_and_deleted(scrapyd: Scrapyd) -> None:
    api = scrapyd.api()
    assert api.add_version("shop", "0.9", io.BytesIO(scrapyd.egg)) == 1
    assert api.list_versions("shop") == ["0.9", "1.0"]  # latest last
    assert api.list_spiders("shop") == ["items"]
    assert api.delete_version("shop", "0.9") is True
    assert api.list_versions("shop") == ["1.0"]

    assert api.add_version("other", "1", io.BytesIO(scrapyd.egg)) == 1
    assert "other" in api.list_projects()
    assert api.delete_project("other") is True
    assert "other" not in api.list_projects()
    assert api.list_versions("other") == []  # as Scrapyd: no error for an unknown one


def _error(status_body: tuple[int, bytes]) -> str:
    status, body = status_body
    data = json.loads(body)
    assert data["status"] == "error" and data["node_name"], data
    return str(data["message"])


def _broken_egg() -> bytes:
    """An egg whose settings module fails to import: `scrapy list` fails on it."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as egg:
        egg.writestr("EGG-INFO/entry_points.txt", "[scrapy]\nsettings = broken.settings\n")
        egg.writestr("broken/__init__.py", "")
        egg.writestr("broken/settings.py", "raise RuntimeError('settings are broken')\n")
    return out.getvalue()


def test_malformed_input_gets_scrapyds_error_shape_and_changes_nothing(
        scrapyd: Scrapyd) -> None:
    api = scrapyd.api()
    projects = api.list_projects()
    assert "egg is not a ZIP file" in _error(scrapyd.post(
        "/addversion.json", {"project": "shop", "version": "2.0", "egg": "shop.egg"}))
    # a broken egg for the version in use does not replace it
    with pytest.raises(ScrapydResponseError, match="settings are broken"):
        api.add_version("shop", "1.0", io.BytesIO(_broken_egg()))
    with pytest.raises(ScrapydResponseError, match="settings are broken"):
        api.add_version("newcomer", "1", io.BytesIO(_broken_egg()))
    no_entry = io.BytesIO()
    with zipfile.ZipFile(no_entry, "w") as egg:
        egg.writestr("shop/__init__.py", "")
    with pytest.raises(ScrapydResponseError, match="entry_points.txt"):
        api.add_version("shop", "2.0", io.BytesIO(no_entry.getvalue()))
    # nothing was kept: the versions and projects are as they were
    assert api.list_versions("shop") == ["1.0"]
    assert api.list_projects() == projects
    assert api.list_spiders("shop") == ["items"]

    assert _error(scrapyd.post("/schedule.json", {"project": "shop"})) == \
        "'spider' parameter is required"
    assert _error(scrapyd.post("/schedule.json", {"project": "nope", "spider": "items"})) == \
        "project 'nope' not found"
    assert _error(scrapyd.post("/schedule.json", {"project": "shop", "spider": "nope"})) == \
        "spider 'nope' not found"
    assert _error(scrapyd.post("/schedule.json", {"project": "shop", "spider": "items",
                                                  "_version": "9.9"})) == \
        "version '9.9' not found"
    assert "priority is invalid" in _error(scrapyd.post(
        "/schedule.json", {"project": "shop", "spider": "items", "priority": "high"}))
    assert _error(scrapyd.post("/delversion.json", {"project": "shop", "version": "7"})) == \
        "version '7' not found"
    assert _error(scrapyd.post("/delproject.json", {"project": "nope"})) == \
        "project 'nope' not found"
    assert "takes POST" in _error(scrapyd.get("/schedule.json?project=shop&spider=items"))
    assert scrapyd.get("/logs/shop/items/no-such-job.log")[0] == 404
    assert api.list_jobs("shop")["pending"] == []


def test_the_token_is_needed_as_basic_auth_password_or_bearer_token(
        scrapyd: Scrapyd) -> None:
    status, body = scrapyd.get("/listprojects.json", auth=False)
    assert status == 401 and "token" in _error((status, body))
    with pytest.raises(ScrapydResponseError, match="401"):
        scrapyd.api(password="not-the-token-at-all").list_projects()
    assert scrapyd.get("/listprojects.json",
                       headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert scrapyd.get("/logs/shop/items/x.log", auth=False)[0] == 401
    assert scrapyd.post("/schedule.json", {"project": "shop", "spider": "items",
                                           "start": scrapyd.demo}, auth=False)[0] == 401
    assert scrapyd.api().list_jobs("shop")["pending"] == []


def test_cross_site_and_dns_rebinding_requests_are_refused(scrapyd: Scrapyd) -> None:
    form = {"project": "shop", "spider": "items", "start": scrapyd.demo}
    status, body = scrapyd.get("/listjobs.json", headers={"Host": "rebind.evil.example"})
    assert status == 421 and "DNS-rebinding" in _error((status, body))
    status, body = scrapyd.post("/schedule.json", form,
                                headers={"Origin": "http://evil.example"})
    assert status == 403 and "cross-site" in _error((status, body))
    status, body = scrapyd.post("/schedule.json", form,
                                headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403
    jobs = scrapyd.api().list_jobs("shop")
    assert jobs["pending"] == [] and jobs["running"] == []


async def test_a_killed_server_loses_no_job_pending_jobs_start_after_it_and_running_ones_end(
        scrapyd: Scrapyd) -> None:
    # (the module's last test on its server: the server is killed and started again)
    api = scrapyd.api()
    await asyncio.to_thread(api.schedule, "shop", "items", start=scrapyd.demo,
                            settings={"DOWNLOAD_DELAY": "1"}, jobid="before-kill")

    async def state(jobid: str) -> str:
        return str(await asyncio.to_thread(api.job_status, "shop", jobid))

    await wait_for(lambda: _is(state("before-kill"), "running"), "the job to start",
                   timeout=60, every=0.2)
    await asyncio.to_thread(api.schedule, "shop", "items", start=scrapyd.demo,
                            settings={"DOWNLOAD_DELAY": "1"}, jobid="waiting")
    assert await state("waiting") == "pending"
    scrapyd.served.kill()  # SIGKILL: nothing of the server's shutdown runs

    port = int(scrapyd.served.url.rsplit(":", 1)[1])
    with crawlhub_serve(scrapyd.serve_args, log=scrapyd.serve_log, port=port):
        # the run the dead server left is stopped and its job finished; the pending job
        # was kept, and takes the free slot
        await wait_for(lambda: _is(state("before-kill"), "finished"),
                       "the killed server's job to be finished", timeout=60, every=0.2)
        await wait_for(lambda: _is(state("waiting"), "running"),
                       "the pending job to start on the new server", timeout=60, every=0.2)
        assert api.cancel("shop", "waiting") == "running"
        await _finished(api, "shop", "waiting")


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)


def _serve_fails(tmp_path: Path, scrapyd: dict[str, Any]) -> Result:
    """``crawlhub serve`` in-process, in ``tmp_path`` (no .env of the repository): it must
    stop before anything is served or set up."""
    config = tmp_path / "main.yaml"
    config.write_text(json.dumps({"data_dir": str(tmp_path / "data"),
                                  "scrapyd": {"enabled": True, **scrapyd}}))
    return CliRunner().invoke(cli_app, ["serve", "-c", str(config), "--port",
                                        str(free_port())], catch_exceptions=False)


def test_serve_refuses_scrapyds_api_on_a_reachable_address_without_a_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 192.0.2.1 (TEST-NET-1) is never this machine's: without the refusal nothing binds
    monkeypatch.chdir(tmp_path)
    served = _serve_fails(tmp_path, {"bind": "192.0.2.1"})
    assert served.exit_code == 2, served.output
    assert "scrapyd.bind is '192.0.2.1'" in " ".join(served.stderr.split())
    assert "server.token" in served.stderr


def test_serve_says_which_key_to_change_when_scrapyds_port_is_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        served = _serve_fails(tmp_path, {"port": taken.getsockname()[1]})
    assert served.exit_code == 2, served.output
    assert "choose another scrapyd.port" in " ".join(served.stderr.split())

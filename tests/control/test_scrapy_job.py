"""A Scrapy project on the control plane, end to end, as a user runs it: a project as
``scrapy startproject`` leaves it, with ``CrawlhubControl`` in its ``EXTENSIONS``, in a local
git repository; a signed webhook builds its release tag (Scrapy and crawlhub's own
dependencies come from the server: nothing is downloaded); a job runs ``scrapy crawl``
in the build against a slow local site; pause stops its requests, continue resumes them,
Scrapy's stats are the run's counters on the run page, and cancel closes Scrapy cleanly.
A job whose spider fails stores its traceback at ERROR."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.agents.test_crawl import SlowSite
from tests.cli.serving import Served, crawlhub_serve
from tests.control.gitremote import Remote, make_remote
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

SECRET = "s3cret-s3cret-s3cret"
#: `scrapy startproject shop`, trimmed to what the job needs, plus the extension
PROJECT = {
    "requirements.txt": "scrapy>=2.11\n",
    "scrapy.cfg": "[settings]\ndefault = shop.settings\n\n[deploy]\nproject = shop\n",
    "shop/__init__.py": "",
    "shop/settings.py": (
        'BOT_NAME = "shop"\nSPIDER_MODULES = ["shop.spiders"]\n'
        'NEWSPIDER_MODULE = "shop.spiders"\nROBOTSTXT_OBEY = False\n'
        "CONCURRENT_REQUESTS = 2\nTELNETCONSOLE_ENABLED = False\nLOG_LEVEL = 'INFO'\n"
        "CRAWLHUB_STATS_INTERVAL = 0.3\n"
        'EXTENSIONS = {"crawlhub.contrib.scrapy.extension.CrawlhubControl": 500}\n'),
    "shop/spiders/__init__.py": "",
    "shop/spiders/pages.py": (
        "import os\n\nimport scrapy\n\n\nclass PagesSpider(scrapy.Spider):\n"
        '    name = "pages"\n\n    async def start(self):\n'
        '        yield scrapy.Request(os.environ["START"])\n\n'
        "    def parse(self, response):\n"
        '        yield {"url": response.url, "title": response.css("title::text").get()}\n'
        '        for href in response.css("a::attr(href)").getall():\n'
        "            yield response.follow(href)\n"),
}


def call(served: Served, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None, raw: bytes | None = None) -> Any:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{served.url}{path}", data=data, method=method,
                                     headers={"content-type": "application/json",
                                              **(headers or {})})
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read()
        return text.decode() if path.startswith("/ui/") else json.loads(text or b"null")


def push_hook(served: Served, remote: Remote, tag: str) -> Any:
    """The forge's signed push event for ``tag`` (GitHub's form)."""
    body = json.dumps({"ref": f"refs/tags/{tag}", "after": remote.commits[tag],
                       "repository": {"full_name": "me/shop"}}).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return call(served, "POST", "/hooks/shop", raw=body, headers={
        "X-GitHub-Event": "push", "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={signature}"})


@contextmanager
def shop_server(tmp_path: Path) -> Iterator[Served]:
    """A server with the Scrapy project ``shop`` built from its release tag by a webhook."""
    remote = make_remote(tmp_path / "git", PROJECT, tags=("release/shop/1.0",))
    with crawlhub_serve(["--data-dir", str(tmp_path / "data")],
                        log=tmp_path / "serve.log") as served:
        call(served, "POST", "/projects/", {"name": "shop", "git_url": remote.url,
                                            "webhook_secret": SECRET})
        answer = push_hook(served, remote, "release/shop/1.0")
        assert answer["version"] == "1.0" and answer["build"], answer
        yield served


async def built(served: Served, build_id: int) -> dict[str, Any]:
    build = await wait_for(lambda: (b := call(served, "GET", f"/builds/{build_id}"))
                           ["status"] in ("succeeded", "failed") and b,
                           "the webhook's build to end", timeout=120, every=0.2)
    assert build["status"] == "succeeded", build["log"]
    return build


def run_lines(served: Served, run_id: str, level: str | None = None) -> list[dict[str, Any]]:
    query = f"/logs?run={run_id}&limit=1000" + (f"&level={level}" if level else "")
    return list(call(served, "GET", query)["lines"])


async def test_a_scrapy_project_is_built_by_its_webhook_run_paused_continued_and_cancelled(
        tmp_path: Path) -> None:
    async with SlowSite(pages=2000, delay=0.1) as site:
        with shop_server(tmp_path) as served:
            [build] = call(served, "GET", "/builds/?project=shop")["builds"]
            build = await built(served, build["id"])
            assert "Requirement already satisfied: scrapy" in build["log"]  # no download
            call(served, "POST", "/jobs/", {
                "name": "shop-pages", "project": "shop", "version": "1.0",
                "command": ["scrapy", "crawl", "pages"],
                "env": {"START": f"{site.url}/page/0"}})
            run_id = call(served, "POST", "/jobs/shop-pages/run")["run_id"]

            def hits() -> int:
                return sum(site.hits.values())

            await wait_for(lambda: hits() >= 5, "the spider to fetch pages", timeout=60)

            # pause: the requests in flight end, then no new one is sent
            call(served, "POST", "/jobs/shop-pages/pause")
            last = [-1]

            def settled() -> bool:  # no request in the last second
                now = hits()
                before, last[0] = last[0], now
                return now == before

            await wait_for(settled, "the paused spider to stop fetching", timeout=30,
                           every=1.0)
            paused_at = hits()
            await asyncio.sleep(1.5)  # a running spider fetches ~30 pages in this time
            assert hits() == paused_at, "a request was sent while paused"

            # continue: it goes on
            call(served, "POST", "/jobs/shop-pages/continue")
            await wait_for(lambda: hits() > paused_at + 5, "the spider to go on", timeout=30)

            # Scrapy's stats are the run's counters, on the API and on the run page
            def counted() -> int:
                counters = call(served, "GET", f"/runs/{run_id}")["run"]["counters"] or {}
                return int(counters.get("item_scraped_count") or 0)

            await wait_for(lambda: counted() > paused_at, "Scrapy's stats as counters",
                           timeout=30)
            page = call(served, "GET", f"/ui/run/{run_id}")
            assert 'data-counter="item_scraped_count"' in page
            assert 'data-counter="downloader/request_count"' in page

            # cancel: Scrapy closes the spider cleanly and the run ends cancelled
            call(served, "POST", "/jobs/shop-pages/cancel")
            run = await wait_for(
                lambda: (r := call(served, "GET", f"/runs/{run_id}")["run"])["status"]
                not in ("queued", "running", "paused") and r, "the run to end", timeout=60)
            assert run["status"] == "cancelled", run
            messages = [line["message"] for line in run_lines(served, run_id)]
            assert any("Spider closed (" in m for m in messages), messages[:50]
            assert any("'finish_reason'" in m for m in messages), messages[:50]
            assert hits() < 2000  # it stopped early


async def test_a_scrapy_jobs_traceback_is_stored_at_error(tmp_path: Path) -> None:
    # needs the runner's stderr-traceback-at-ERROR (issue 18, item 10; helper h3)
    with shop_server(tmp_path) as served:
        [build] = call(served, "GET", "/builds/?project=shop")["builds"]
        await built(served, build["id"])
        call(served, "POST", "/jobs/", {"name": "broken", "project": "shop",
                                        "version": "1.0",
                                        "command": ["scrapy", "crawl", "no-such-spider"]})
        run_id = call(served, "POST", "/jobs/broken/run")["run_id"]
        run = await wait_for(
            lambda: (r := call(served, "GET", f"/runs/{run_id}")["run"])["status"]
            not in ("queued", "running") and r, "the run to fail", timeout=60)
        assert run["status"] == "failed", run
        stored = run_lines(served, run_id)
        assert not any("ModuleNotFoundError" in line["message"] for line in stored)
        assert any("Spider not found: no-such-spider" in line["message"] for line in stored)
        errors = [line["message"] for line in run_lines(served, run_id, level="error")]
        assert any("Traceback (most recent call last)" in m for m in errors), stored
        assert any("Spider not found: no-such-spider" in m for m in errors), stored

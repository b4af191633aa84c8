"""``crawlhub crawl`` under a job runner's control: paused it fetches nothing, continued it
finishes with every page once and its counters in the counters file; an exit (or a
SIGTERM) writes every page in flight and the same command resumes without fetching any
page twice."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from crawlhub import sdk
from crawlhub.app.crawl import Crawl, CrawlOptions
from crawlhub.core import jobprotocol as protocol
from tests.agents.test_crawl import CRAWLHUB, SlowSite, rows
from tests.helpers import wait_for


def set_state(path: Path, state: str) -> None:
    protocol.write_json_atomic(path, {"state": state, "changed_at": time.time()})


def page_hits(site: SlowSite) -> int:
    return sum(n for path, n in site.hits.items() if path.startswith("/page/"))


def crawl_argv(site: SlowSite, out: Path, data: Path) -> list[str]:
    """``crawlhub crawl`` of ``site`` from its first page, following links, 4 at a time."""
    return [CRAWLHUB, "crawl", f"{site.url}/page/0", "--follow", "--concurrency", "4",
            "--out", str(out), "--data-dir", str(data), "--quiet"]


async def test_crawl_under_a_control_file_pauses_continues_and_loses_no_page(
        tmp_path: Path) -> None:
    out, data = tmp_path / "items.jsonl", tmp_path / "data"
    control, counts = tmp_path / "control.json", tmp_path / "counters.json"
    set_state(control, "run")
    env = {**os.environ, protocol.ENV_CONTROL_FILE: str(control),
           protocol.ENV_COUNTERS_FILE: str(counts), protocol.ENV_JOB: "site",
           protocol.ENV_RUN: "r-1"}
    async with SlowSite(pages=200, delay=0.02) as site:
        proc = await asyncio.create_subprocess_exec(*crawl_argv(site, out, data), env=env,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            await wait_for(lambda: page_hits(site) >= 20, "20 pages fetched")
            set_state(control, "pause")
            await asyncio.sleep(1.0)  # the pause lands; the four fetches in flight end
            held = page_hits(site)
            await asyncio.sleep(1.0)
            assert page_hits(site) == held, "pages were fetched while paused"
            assert held < 200
            set_state(control, "run")
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
        assert proc.returncode == 0, err.decode()
        pages = {f"/page/{n}" for n in range(200)}
        assert {p: site.hits[p] for p in pages} == dict.fromkeys(pages, 1)
        assert len(rows(out)) == 200
        counters = (protocol.read_json(counts) or {})["counters"]
        assert counters["pages"] == 200 and counters["items"] == 200
        assert counters["errors"] == 0


async def test_crawl_exit_writes_the_pages_in_flight_and_the_same_crawl_resumes(
        tmp_path: Path) -> None:
    out, data = tmp_path / "items.jsonl", tmp_path / "data"
    async with SlowSite(pages=150, delay=0.05) as site:
        control = sdk.Manual()
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=data,
                            follow=True, concurrency=4, control=control)
        first = asyncio.create_task(Crawl(opts).run())
        await wait_for(lambda: page_hits(site) >= 20, "20 pages fetched")
        control.set("exit")
        progress = await asyncio.wait_for(first, 30)
        assert progress.exited
        fetched = {p for p, n in site.hits.items() if p.startswith("/page/") and n}
        written = {i["url"].removeprefix(site.url) for i in rows(out)}
        assert written == fetched  # every fetch in flight at the exit was written
        assert progress.pages == len(fetched) < 150
        opts.control = None
        again = await Crawl(opts).run()
        assert not again.exited
        pages = {f"/page/{n}" for n in range(150)}
        assert {p: site.hits[p] for p in pages} == dict.fromkeys(pages, 1)
        assert len(rows(out)) == 150


async def test_sigterm_stops_a_crawl_cleanly_and_the_same_command_resumes(
        tmp_path: Path) -> None:
    """What a job runner's cancel sends: the pages in flight are written, none is lost."""
    out, data = tmp_path / "items.jsonl", tmp_path / "data"
    async with SlowSite(pages=120, delay=0.03) as site:
        argv = crawl_argv(site, out, data)
        first = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
        try:
            await wait_for(lambda: page_hits(site) >= 20, "20 pages fetched")
            first.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(first.communicate(), 30)
        finally:
            if first.returncode is None:
                first.kill()
        assert first.returncode == 0, err.decode()
        assert "stopped on request" in err.decode()
        fetched = {p for p, n in site.hits.items() if p.startswith("/page/") and n}
        assert {i["url"].removeprefix(site.url) for i in rows(out)} == fetched
        assert len(fetched) < 120
        second = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode == 0, err.decode()
        pages = {f"/page/{n}" for n in range(120)}
        assert {p: site.hits[p] for p in pages} == dict.fromkeys(pages, 1)
        assert len(rows(out)) == 120

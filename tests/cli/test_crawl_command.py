"""``crawlhub crawl``'s words at the edges: a start URL out of reach is one error line
naming the host and the reason (exit 1), a robots.txt that cannot be had is named in the
summary as what it is, and Ctrl-C says what was saved and that the same command resumes."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.agents.servers import Site, _Server
from tests.cli.serving import crawlhub_command
from tests.helpers import wait_for
from tests.servers import free_port


async def crawl(*args: str) -> tuple[int, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        *crawlhub_command(), "crawl", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, err.decode().splitlines()


@pytest.mark.parametrize("robots", ["--robots", "--no-robots"])
async def test_a_start_url_nothing_listens_on_is_one_line_naming_the_host_and_exit_1(
        tmp_path: Path, robots: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    code, lines = await crawl(url, robots, "--out", str(tmp_path / "items.jsonl"),
                              "--data-dir", str(tmp_path / "data"))
    assert code == 1
    assert lines == [f"error cannot reach 127.0.0.1:{port} (start URL {url}):"
                     " connection refused"]


async def test_a_start_url_redirecting_to_a_host_out_of_reach_names_where_it_led(
        tmp_path: Path) -> None:
    port = free_port()
    async with Site() as site:
        start = f"{site.url}/to?url=http://127.0.0.1:{port}/gone"
        code, lines = await crawl(start, "--no-robots", "--out", str(tmp_path / "i.jsonl"),
                                  "--data-dir", str(tmp_path / "data"))
    assert code == 1
    assert lines == [f"error cannot reach 127.0.0.1:{site.port} (start URL {start}):"
                     f" redirected to 127.0.0.1:{port}, which gave no answer: connection"
                     " refused"]


class FailingRobots(_Server):
    """A page at / and a robots.txt that answers ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status
        self.app.router.add_get("/robots.txt", self.robots)
        self.app.router.add_get("/", self.page)

    async def robots(self, request: web.Request) -> web.Response:
        return web.Response(status=self.status, text="not implemented")

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(text="<title>home</title>", content_type="text/html")


async def test_a_robots_txt_answering_501_is_named_in_the_summary_not_as_disallowed(
        tmp_path: Path) -> None:
    async with FailingRobots(501) as site:
        code, lines = await crawl(f"{site.url}/", "--out", str(tmp_path / "items.jsonl"),
                                  "--data-dir", str(tmp_path / "data"))
    assert code == 0
    [summary] = lines
    assert "0 disallowed by robots.txt" in summary
    assert (f"1 not fetched because robots.txt could not be had ({site.url}/robots.txt"
            " answered 501: RFC 9309 disallows everything then)") in summary


class HeldSite(Site):
    """The test site whose pages from ``held_from`` on answer only once ``release`` is
    set: a crawl cannot end before the test has interrupted it, however fast it runs."""

    def __init__(self, pages: int, held_from: int) -> None:
        super().__init__(pages=pages)
        self.held_from = held_from
        self.app.middlewares.insert(0, self._hold)

    @web.middleware
    async def _hold(self, request: web.Request, handler: Any) -> web.StreamResponse:
        page = request.match_info.get("n")
        if page is not None and int(page) >= self.held_from:
            await self.release.wait()
        return await handler(request)  # type: ignore[no-any-return]


async def test_ctrl_c_says_what_was_saved_and_that_the_same_command_resumes(
        tmp_path: Path) -> None:
    out, data = tmp_path / "items.jsonl", tmp_path / "data"
    argv = [*crawlhub_command(), "crawl", "--follow", "--concurrency", "2", "--out", str(out),
            "--data-dir", str(data)]

    def written() -> int:  # items in the user's output
        return out.read_bytes().count(b"\n") if out.exists() else 0

    # pages 0-99 answer at once, the rest once Ctrl-C is sent: the crawl is still going
    async with HeldSite(pages=300, held_from=100) as site:
        argv.insert(2, f"{site.url}/page/0")
        first = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
        await wait_for(lambda: written() >= 10, "10 items written", timeout=60)
        first.send_signal(signal.SIGINT)
        site.release.set()
        _, err = await asyncio.wait_for(first.communicate(), 60)
        assert first.returncode == 130
        [said] = err.decode().splitlines()
        assert said.startswith("interrupted: ") and f"are in {out}" in said
        assert f"the crawl's state in {data}; the same command resumes it" in said
        second = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(second.communicate(), 120)
        assert second.returncode == 0, err.decode()
    urls = [json.loads(line)["url"] for line in out.read_text().splitlines()]
    assert sorted(urls) == sorted(f"{site.url}/page/{n}" for n in range(300))


async def test_ctrl_c_stops_a_crawl_whose_parent_ignored_sigint(tmp_path: Path) -> None:
    """A crawl started from a shell or a runner that ignores SIGINT (nohup, some CI
    runners: the disposition is inherited) still stops on Ctrl-C, says what was saved
    and ends 130; before, it went on to the end and said 0."""
    out, data = tmp_path / "items.jsonl", tmp_path / "data"

    def written() -> int:
        return out.read_bytes().count(b"\n") if out.exists() else 0

    async with HeldSite(pages=300, held_from=100) as site:
        argv = [*crawlhub_command(), "crawl", f"{site.url}/page/0", "--follow",
                "--concurrency", "2", "--out", str(out), "--data-dir", str(data)]
        first = await asyncio.create_subprocess_exec(
            *argv, stderr=asyncio.subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        await wait_for(lambda: written() >= 10, "10 items written", timeout=60)
        first.send_signal(signal.SIGINT)
        site.release.set()
        _, err = await asyncio.wait_for(first.communicate(), 60)
    assert first.returncode == 130, err.decode()
    assert err.decode().startswith("interrupted: ")
    assert written() < 300

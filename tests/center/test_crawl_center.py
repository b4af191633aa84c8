"""``crawlhub crawl --center``: a crawl whose downloads go through the center's agents
(in process here, on a memory bus): every page once, the agents extract, and with
``chained`` every link goes back to the agent that found it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from crawlhub.app.crawl import Crawl, CrawlOptions
from crawlhub.center import CenterError, CenterWorker, DownloadCenter, open_bus
from tests.agents.servers import Site
from tests.agents.test_crawl import rows
from tests.helpers import wait_for


@pytest.mark.parametrize("strategy", ["chained", "random"])
async def test_a_crawl_through_the_center_fetches_every_page_once(
        tmp_path: Path, strategy: str) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    stop = asyncio.Event()
    parts = [DownloadCenter(open_bus(url), check_every=0.1),
             CenterWorker(open_bus(url), "a1", beat_every=0.1),
             CenterWorker(open_bus(url), "a2", beat_every=0.1)]
    tasks = [asyncio.create_task(p.run(stop)) for p in parts]
    try:
        center = parts[0]
        assert isinstance(center, DownloadCenter)
        await wait_for(lambda: len(center.live_agents()) >= 2, "2 live agents")
        async with Site(pages=120) as site:
            out = tmp_path / "items.jsonl"
            # chained, one start page: every page is found on a page its agent fetched
            starts = [f"{site.url}/page/0"] if strategy == "chained" else \
                [f"{site.url}/page/0", f"{site.url}/page/60"]
            opts = CrawlOptions(urls=starts, out=out,
                                data_dir=tmp_path / "data", follow=True, robots=False,
                                extract={"fields": {"heading": {"css": "h1::text"}}},
                                center=url, strategy=strategy, agents=2)
            progress = await Crawl(opts).run()
            items = rows(out)
            assert len(items) == 120 == len({i["url"] for i in items})
            assert all(site.hits[f"/page/{n}"] == 1 for n in range(120))
            assert {i["heading"] for i in items} == {f"Page {n}" for n in range(120)}
            assert progress.errors == 0
        served = [p.pages for p in parts[1:]]  # type: ignore[attr-defined]
        assert sum(served) == 120
        if strategy == "chained":  # the whole graph stays on the start page's agent
            assert sorted(served) == [0, 120]
        else:
            assert all(served)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in parts:
            await p.bus.close()


async def test_a_crawl_with_no_center_fails_before_fetching(tmp_path: Path) -> None:
    async with Site(pages=5) as site:
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=tmp_path / "items.jsonl",
                            data_dir=tmp_path / "data", center=f"memory://{uuid.uuid4().hex}",
                            strategy="fixed", agents=2, allocate_timeout=0.5)
        with pytest.raises(CenterError, match="no answer to its allocation"):
            await Crawl(opts).run()
        assert site.hits.total() == 0
    with contextlib.suppress(FileNotFoundError):
        assert rows(tmp_path / "items.jsonl") == []


async def test_a_rendered_crawl_through_the_center_is_rendered_by_its_agents(
        tmp_path: Path) -> None:
    """``crawl --render --center``: the center's agent renders each page in its own
    Chromium (the waits travel with the request) and extracts from the DOM its scripts
    built; a render request with bad waits is answered with the reason, not fetched."""
    from crawlhub.agents.browser import RenderConfig
    from crawlhub.center.client import CenterClient
    from crawlhub.demo.site import js_price, js_title
    from tests.agents.test_render import Demo, require_browser

    require_browser()
    url = f"memory://{uuid.uuid4().hex}"
    stop = asyncio.Event()
    worker = CenterWorker(open_bus(url), "r1", beat_every=0.1,
                          render_config=RenderConfig(concurrency=2, timeout=20))
    parts = [DownloadCenter(open_bus(url), check_every=0.1), worker]
    tasks = [asyncio.create_task(p.run(stop)) for p in parts]
    try:
        center = parts[0]
        assert isinstance(center, DownloadCenter)
        await wait_for(lambda: len(center.live_agents()) >= 1, "a live agent")
        async with Demo(js_pages=6) as demo:
            out = tmp_path / "items.jsonl"
            opts = CrawlOptions(urls=[f"{demo.url}/js/"], out=out, data_dir=tmp_path / "data",
                                follow=True, robots=False, render=True,
                                wait_for="#app[data-ready]",
                                extract={"fields": {"price": {"css": ".price::text"}}},
                                center=url, strategy="random", agents=1)
            progress = await Crawl(opts).run()
            by_url = {i["url"]: i for i in rows(out)}
            assert progress.errors == 0 and len(by_url) == 7  # /js/ and its 6 products
            for n in range(6):
                item = by_url[f"{demo.url}/js/p/{n}"]
                assert (item["title"], item["price"]) == (js_title(n), js_price(n))
            assert worker.pages == 7

            async def render_by(job: str, page: str, render: dict[str, str]) -> Any:
                """One render request of a job of its own (allocated, then released)."""
                client = CenterClient(open_bus(url), job=f"{job}-{uuid.uuid4().hex[:6]}",
                                      strategy="random", agents=1, timeout=20)
                await client.open()
                try:
                    return await client.fetch(page, render=render)
                finally:
                    await client.close()

            # another job renders in the same browser, in a context of its own; the crawl's
            # job is over (released): none of its pages is left
            reply = await render_by("two", f"{demo.url}/js/p/2",
                                    {"wait_for": "#app[data-ready]"})
            assert reply.ok and js_title(2).encode() in reply.body, reply.error
            assert worker.browser is not None
            await wait_for(lambda: worker.browser is not None
                           and worker.browser.stats()["browser/contexts"] == 0,
                           "the released jobs' pages to close")
            assert worker.browser.stats()["browser/launches"] == 1

            # a job asking for a wait the browser has no such event for: refused, said why
            reply = await render_by("bad", f"{demo.url}/js/p/1", {"wait_until": "whenever"})
            assert not reply.ok and "bad render request" in reply.error
            assert "wait_until" in reply.error
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in parts:
            await p.bus.close()

"""The one-process crawl and the domain gate: a resumed crawl owns its data dir (its lock),
so the slots a killed run left held are freed at once, not waited out."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from crawlhub.agents.politeness import DomainRules, open_gate_store
from crawlhub.app.crawl import Crawl, CrawlOptions
from tests.agents.servers import Site


async def test_a_resumed_crawl_does_not_wait_for_the_slots_a_killed_run_held(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # What a run killed mid-request leaves: both slots of the domain leased for an hour.
    store = open_gate_store(f"sqlite:///{data / 'politeness.db'}")
    await store.acquire("127.0.0.1", 2, time.time(), DomainRules(concurrency=2, lease=3600),
                        "killed")
    await store.close()
    async with Site(pages=20) as site:
        out = tmp_path / "items.jsonl"
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=data,
                            follow=True, per_domain=2)
        # The bound only stops a hung test: without the reset it waits an hour.
        progress = await asyncio.wait_for(Crawl(opts).run(), 120)
        assert progress.pages == 20
        assert site.peak <= 2

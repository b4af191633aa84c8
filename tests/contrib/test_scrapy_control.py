"""The Scrapy extension CrawlhubControl with a real ``scrapy runspider`` process and a real
local site: paused, the spider starts no request; continued, it goes on; its stats reach
the counters file; exit closes it cleanly with every stat flushed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crawlhub.core import jobprotocol as protocol
from tests.agents.test_crawl import SlowSite
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SPIDER = Path(__file__).with_name("spider.py")
EXTENSION = "crawlhub.contrib.scrapy.extension.CrawlhubControl"


def set_state(path: Path, state: str) -> None:
    protocol.write_json_atomic(path, {"state": state, "changed_at": time.time()})


def counters(path: Path) -> dict[str, Any]:
    data = protocol.read_json(path)
    return data["counters"] if isinstance(data, dict) else {}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_a_spider_pauses_continues_reports_its_stats_and_exits(tmp_path: Path) -> None:
    control, counts = tmp_path / "control.json", tmp_path / "counters.json"
    items, log = tmp_path / "items.jsonl", tmp_path / "spider.log"
    ack = tmp_path / "ack.json"
    set_state(control, "run")
    async with SlowSite(pages=300, delay=0.05) as site:
        settings = {"EXTENSIONS": json.dumps({EXTENSION: 500}), "CONCURRENT_REQUESTS": "2",
                    "ROBOTSTXT_OBEY": "False", "TELNETCONSOLE_ENABLED": "False",
                    "LOG_LEVEL": "INFO", "CRAWLHUB_STATS_INTERVAL": "0.3"}
        args = [sys.executable, "-m", "scrapy", "runspider", str(SPIDER)]
        for k, v in settings.items():
            args += ["-s", f"{k}={v}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
               "ITEMS": str(items),
               "START": f"{site.url}/page/0", protocol.ENV_CONTROL_FILE: str(control),
               protocol.ENV_COUNTERS_FILE: str(counts), protocol.ENV_ACK_FILE: str(ack)}
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *args, cwd=str(ROOT), env=env, stdout=asyncio.subprocess.DEVNULL, stderr=err)
        try:
            await wait_for(lambda: lines(items) >= 5, "the spider to parse pages")
            set_state(control, "pause")
            # the spider says it holds still once the requests in flight ended, so the
            # runner does not have to stop its process
            await wait_for(lambda: ack.exists() and protocol.read_json(ack)["state"] == "pause",
                           "the spider to acknowledge the pause")
            await asyncio.sleep(0.8)  # the pause lands; the two requests in flight end
            hits, parsed = sum(site.hits.values()), lines(items)
            await asyncio.sleep(0.8)
            assert sum(site.hits.values()) == hits, "a request was sent while paused"
            assert lines(items) == parsed
            set_state(control, "run")
            await wait_for(lambda: lines(items) > parsed, "the spider to go on")
            await wait_for(lambda: counters(counts).get("item_scraped_count", 0) > parsed,
                           "Scrapy's stats in the counters file")
            assert counters(counts)["downloader/request_count"] > parsed
            set_state(control, "exit")
            code = await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
        text = log.read_text(errors="replace")
        assert code == 0, text[-3000:]
        assert "'finish_reason': 'crawlhub_exit'" in text
        assert lines(items) < 300  # it stopped early
        final = counters(counts)
        # the last stats were flushed at the close: every parsed page is counted
        assert final["item_scraped_count"] == lines(items)
        assert final["response_received_count"] == lines(items)
        # Scrapy's final stats as the run's page shows them (ScrapydWeb's)
        assert final["finish_reason"] == "crawlhub_exit"
        assert final["elapsed_time_seconds"] > 0


def test_the_extension_is_off_without_a_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    from scrapy.exceptions import NotConfigured
    from scrapy.utils.test import get_crawler

    from crawlhub.contrib.scrapy.extension import CrawlhubControl

    monkeypatch.delenv(protocol.ENV_CONTROL_FILE, raising=False)
    monkeypatch.delenv(protocol.ENV_COUNTERS_FILE, raising=False)
    with pytest.raises(NotConfigured):
        CrawlhubControl.from_crawler(get_crawler())

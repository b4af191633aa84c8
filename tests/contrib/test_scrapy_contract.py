"""crawlhub's Scrapy scheduler keeps Scrapy's scheduler and dupefilter contract: order,
length, pending work, close and persistence, on the embedded store and on Redis.

The scheduler runs in this process against a real SQLite directory or a real Redis; the
engine is a stand-in with the one slot method the scheduler hooks (as Scrapy's own
scheduler tests stand one in)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from crawlhub.contrib.scrapy import DupeFilter, Scheduler
from crawlhub.contrib.scrapy.settings import read_settings
from crawlhub.core.errors import ConfigError
from tests.helpers import wait_for


class Spider(scrapy.Spider):
    name = "contract"

    def parse(self, response: Any) -> Any:
        return None


class _Slot:
    """The engine slot the scheduler hooks: it calls ``remove_request`` when done."""

    class nextcall:  # noqa: N801 - Scrapy's attribute name
        @staticmethod
        def schedule() -> None:
            return None

    def remove_request(self, request: scrapy.Request) -> None:
        return None


class _Engine:
    def __init__(self, downloader: Any = None) -> None:
        self._slot = _Slot()
        self.downloader = downloader


@pytest.fixture(params=["sqlite", "redis"])
def storage(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str) -> dict[str, str]:
    if request.param == "redis":
        return {"CRAWLHUB_URL": str(request.getfixturevalue("redis_url")),
                "CRAWLHUB_PREFIX": f"{unique_name}:"}
    return {"CRAWLHUB_URL": str(tmp_path / "data")}


def open_scheduler(settings: dict[str, Any], engine: Any = None) -> Scheduler:
    crawler = get_crawler(Spider, {"SCHEDULER": "crawlhub.contrib.scrapy.Scheduler",
                                   "DUPEFILTER_CLASS": "crawlhub.contrib.scrapy.DupeFilter",
                                   "CONCURRENT_REQUESTS": 4, **settings})
    crawler.engine = engine or _Engine()  # type: ignore[assignment]
    scheduler = Scheduler.from_crawler(crawler)
    spider = Spider.from_crawler(crawler)
    crawler.spider = spider
    scheduler.open(spider)
    return scheduler


def drain(scheduler: Scheduler) -> list[scrapy.Request]:
    """Dequeue while the scheduler says it has work; each answer must be a request."""
    out: list[scrapy.Request] = []
    while scheduler.has_pending_requests():
        request = scheduler.next_request()
        assert request is not None, f"pending work but no request after {len(out)}"
        out.append(request)
    return out


def urls(n: int, prefix: str = "http://127.0.0.1/p/") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_an_enqueued_request_is_dequeued_at_once_and_a_fresh_scheduler_owes_nothing(
        storage: dict[str, str]) -> None:
    scheduler = open_scheduler(storage)
    try:
        assert not scheduler.has_pending_requests()
        assert len(scheduler) == 0
        assert scheduler.next_request() is None
        assert scheduler.enqueue_request(scrapy.Request("http://127.0.0.1/a"))
        request = scheduler.next_request()
        assert request is not None and request.url == "http://127.0.0.1/a"
        assert not scheduler.has_pending_requests()
    finally:
        scheduler.close("finished")


def test_len_counts_every_pending_request_of_the_crawl_not_the_prefetch(
        storage: dict[str, str]) -> None:
    scheduler = open_scheduler(storage)  # prefetch: CONCURRENT_REQUESTS = 4
    try:
        for url in urls(40):
            scheduler.enqueue_request(scrapy.Request(url))
        assert len(scheduler) == 40
        assert scheduler.next_request() is not None
        assert len(scheduler) == 39  # the one dequeued is running, not pending
        assert len(drain(scheduler)) == 39
        assert len(scheduler) == 0
    finally:
        scheduler.close("finished")


def test_a_late_higher_priority_request_comes_out_next_ahead_of_the_prefetch(
        storage: dict[str, str]) -> None:
    scheduler = open_scheduler(storage)
    try:
        for url in urls(30):
            scheduler.enqueue_request(scrapy.Request(url))
        assert scheduler.next_request() is not None
        scheduler.enqueue_request(scrapy.Request("http://127.0.0.1/urgent", priority=10))
        request = scheduler.next_request()
        assert request is not None and request.url == "http://127.0.0.1/urgent"
        priorities = [5, -3, 0, 7, -1]
        for i, p in enumerate(priorities):
            scheduler.enqueue_request(scrapy.Request(f"http://127.0.0.1/q/{i}", priority=p))
        got = [r.priority for r in drain(scheduler)]
        assert got[:3] == [7, 5, 0] and got[-2:] == [-1, -3]  # never an inversion
        assert got == sorted(got, reverse=True)
    finally:
        scheduler.close("finished")


@pytest.mark.parametrize(("settings", "order"), [
    ({}, "lifo"),  # Scrapy's default: LifoMemoryQueue
    ({"CRAWLHUB_ORDER": "fifo"}, "fifo"),
    ({"SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue"}, "fifo"),
])
def test_requests_of_one_priority_come_out_in_scrapys_order_or_the_one_asked_for(
        storage: dict[str, str], settings: dict[str, str], order: str) -> None:
    scheduler = open_scheduler({**storage, **settings})
    try:
        sent = urls(20)  # five times the prefetch: the store's order counts too
        for url in sent:
            scheduler.enqueue_request(scrapy.Request(url))
        got = [r.url for r in drain(scheduler)]
        assert got == (sent[::-1] if order == "lifo" else sent)
    finally:
        scheduler.close("finished")


class _Downloader:
    """Scrapy's downloader as DownloaderAwarePriorityQueue sees it: slots and actives."""

    class _SlotState:
        def __init__(self) -> None:
            self.active: set[Any] = set()

    def __init__(self) -> None:
        self.slots: dict[str, _Downloader._SlotState] = {}

    def get_slot_key(self, request: scrapy.Request) -> str:
        return str(request.meta["download_slot"])


def test_the_downloader_aware_queue_serves_the_least_busy_slot_and_others_are_refused(
        storage: dict[str, str]) -> None:
    downloader = _Downloader()
    scheduler = open_scheduler(
        {**storage, "CRAWLHUB_PREFETCH": 8,  # fair among the requests held: all six
         "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue"},
        _Engine(downloader))
    try:
        for i, slot in enumerate("aabbcc"):
            scheduler.enqueue_request(scrapy.Request(f"http://127.0.0.1/{i}",
                                                     meta={"download_slot": slot}))
        slots = []
        while scheduler.has_pending_requests():
            request = scheduler.next_request()
            assert request is not None
            slot = downloader.get_slot_key(request)
            downloader.slots.setdefault(slot, _Downloader._SlotState()).active.add(request)
            slots.append(slot)
        assert sorted(slots[:3]) == ["a", "b", "c"] and sorted(slots[3:]) == ["a", "b", "c"]
    finally:
        scheduler.close("finished")
    with pytest.raises(ConfigError, match="SCHEDULER_PRIORITY_QUEUE"):
        open_scheduler({**storage, "SCHEDULER_PRIORITY_QUEUE": "my.pqueues.Custom"})


def test_persisted_requests_resume_with_a_log_line_and_a_finished_crawl_is_dropped(
        storage: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    persist = {**storage, "SCHEDULER_PERSIST": True}
    scheduler = open_scheduler(persist)
    for url in urls(10):
        scheduler.enqueue_request(scrapy.Request(url))
    assert scheduler.next_request() is not None  # held ahead: returned on close
    scheduler.close("shutdown")
    with caplog.at_level(logging.INFO, "crawlhub.contrib.scrapy"):
        scheduler = open_scheduler(persist)
    try:
        assert "Resuming crawl (9 requests scheduled)" in caplog.text
        assert scheduler.has_pending_requests() and len(scheduler) == 9
        scheduler.enqueue_request(scrapy.Request(urls(10)[3]))  # seen in the first run
        got = [r.url for r in drain(scheduler)]
        assert len(got) == 9 and set(got) < set(urls(10))  # the repeat was filtered
    finally:
        scheduler.close("finished")
    storage = {**storage, "CRAWLHUB_CRAWL": "another"}
    scheduler = open_scheduler(storage)  # SCHEDULER_PERSIST off: dropped at its end
    try:
        assert scheduler.enqueue_request(scrapy.Request(urls(10)[0]))
        assert len(drain(scheduler)) == 1
    finally:
        scheduler.close("finished")
    scheduler = open_scheduler(storage)
    try:
        assert not scheduler.has_pending_requests() and len(scheduler) == 0
        assert len(drain(scheduler)) == 0
        assert scheduler.enqueue_request(scrapy.Request(urls(10)[0]))
        assert [r.url for r in drain(scheduler)] == [urls(10)[0]]  # forgotten: new again
    finally:
        scheduler.close("finished")


def test_jobdir_is_the_embedded_store_and_keeps_the_job(tmp_path: Path) -> None:
    jobdir = {"JOBDIR": str(tmp_path / "job")}
    scheduler = open_scheduler(jobdir)
    scheduler.enqueue_request(scrapy.Request("http://127.0.0.1/j"))
    scheduler.close("finished")  # as Scrapy: a job directory keeps the job
    assert (tmp_path / "job" / "frontier.db").is_file()
    scheduler = open_scheduler(jobdir)
    try:
        assert [r.url for r in drain(scheduler)] == ["http://127.0.0.1/j"]
    finally:
        scheduler.close("finished")


class CaseBlind:
    """A custom fingerprinter: URLs differing in case are one request."""

    def fingerprint(self, request: scrapy.Request) -> bytes:
        return request.url.lower().encode()


def test_a_custom_fingerprinter_decides_duplicates_even_when_canonical_keys_are_asked(
        storage: dict[str, str]) -> None:
    scheduler = open_scheduler({**storage, "CRAWLHUB_KEY": "canonical",
                                "REQUEST_FINGERPRINTER_CLASS": CaseBlind})
    try:
        assert scheduler.enqueue_request(scrapy.Request("http://127.0.0.1/Index.html"))
        assert not scheduler.enqueue_request(scrapy.Request("http://127.0.0.1/INDEX.html"))
        assert len(drain(scheduler)) == 1
    finally:
        scheduler.close("finished")
    canonical = read_settings(get_crawler(Spider, {**storage, "CRAWLHUB_KEY": "canonical"}
                                          ).settings, "s")
    assert canonical.key == "canonical"
    assert read_settings(get_crawler(Spider, storage).settings, "s").key == "fingerprint"


def standalone(settings: dict[str, Any]) -> DupeFilter:
    crawler = get_crawler(Spider, {"DUPEFILTER_CLASS": "crawlhub.contrib.scrapy.DupeFilter",
                                   **settings})
    df = DupeFilter.from_crawler(crawler)
    df.open()
    return df


@pytest.mark.parametrize("persisted", [True, False])
def test_the_dupefilter_alone_forgets_between_runs_unless_persisted(
        storage: dict[str, str], persisted: bool) -> None:
    settings = {**storage, "SCHEDULER_PERSIST": persisted}
    seen = scrapy.Request("http://127.0.0.1/seen")
    df = standalone(settings)
    assert not df.request_seen(seen) and df.request_seen(seen)
    df.close("finished")
    df = standalone(settings)
    try:
        assert df.request_seen(seen) is persisted
    finally:
        df.close("finished")
    df = standalone({**settings, "SCHEDULER_FLUSH_ON_START": True})
    try:
        assert not df.request_seen(seen)  # flushed before the first request
    finally:
        df.close("finished")


def test_dupefilter_debug_lines_come_from_scrapys_logger_with_the_referer(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    crawler = get_crawler(Spider, {"DUPEFILTER_DEBUG": True,
                                   "CRAWLHUB_URL": str(tmp_path / "data")})
    df = DupeFilter.from_crawler(crawler)
    spider = Spider.from_crawler(crawler)
    with caplog.at_level(logging.DEBUG, "scrapy.dupefilters"):
        df.log(scrapy.Request("http://127.0.0.1/x"), spider)
        df.log(scrapy.Request("http://127.0.0.1/x", headers={"Referer": "http://127.0.0.1/"}),
               spider)
    assert ("scrapy.dupefilters", logging.DEBUG,
            "Filtered duplicate request: <GET http://127.0.0.1/x> (referer: None)"
            ) in caplog.record_tuples
    assert ("scrapy.dupefilters", logging.DEBUG,
            "Filtered duplicate request: <GET http://127.0.0.1/x> (referer: http://127.0.0.1/)"
            ) in caplog.record_tuples
    assert crawler.stats is not None and crawler.stats.get_value("dupefilter/filtered") == 2


def test_scrapy_redis_settings_and_sqlite_urls_are_read(tmp_path: Path) -> None:
    def crawl(**settings: Any) -> Any:
        return read_settings(get_crawler(Spider, settings).settings, "s")

    directory = tmp_path / "data"
    s = crawl(CRAWLHUB_URL=f"sqlite:///{directory}")
    assert s.frontier_url == f"sqlite:///{directory}/frontier.db"
    s = crawl(CRAWLHUB_URL=f"sqlite:///{tmp_path}/crawl.db")
    assert s.frontier_url == f"sqlite:///{tmp_path}/crawl.db"
    assert crawl(REDIS_URL="redis://127.0.0.1:6379/3").frontier_url == "redis://127.0.0.1:6379/3"
    s = crawl(REDIS_HOST="127.0.0.1", REDIS_PORT=6380,
              REDIS_PARAMS={"db": 2, "password": "p w"})
    assert s.frontier_url == "redis://:p%20w@127.0.0.1:6380/2"
    s = crawl(CRAWLHUB_URL="redis://127.0.0.1:6379/1", REDIS_URL="redis://127.0.0.1:6379/3")
    assert s.frontier_url == "redis://127.0.0.1:6379/1"  # CRAWLHUB_URL first
    s = crawl(REDIS_URL="redis://127.0.0.1:6379/0", SCHEDULER_IDLE_BEFORE_CLOSE=7,
              SCHEDULER_QUEUE_CLASS="scrapy_redis.queue.PriorityQueue",
              REDIS_START_URLS_KEY="%(name)s:start_urls", REDIS_START_URLS_AS_SET=True)
    assert (s.max_idle, s.order, s.start_urls_key, s.start_urls_as_set) == (
        7.0, "fifo", "s:start_urls", True)
    assert crawl(REDIS_URL="redis://127.0.0.1:6379/0",
                 SCHEDULER_QUEUE_CLASS="scrapy_redis.queue.LifoQueue").order == "lifo"
    assert crawl(REDIS_URL="redis://127.0.0.1:6379/0",
                 SCHEDULER_QUEUE_CLASS="scrapy_redis.queue.FifoQueue").order == "fifo"
    with pytest.raises(ConfigError, match="REDIS_START_URLS_KEY"):
        crawl(CRAWLHUB_URL=str(directory), REDIS_START_URLS_KEY="k")
    with pytest.raises(ConfigError, match="CRAWLHUB_URL"):
        crawl(CRAWLHUB_URL="sqlite://:memory:")
    assert crawl(CRAWLHUB_URL=str(directory)).loop == "engine"
    assert crawl(CRAWLHUB_URL=str(directory), CRAWLHUB_LOOP="thread").loop == "thread"
    with pytest.raises(ConfigError, match="CRAWLHUB_LOOP.*'fiber'"):
        crawl(CRAWLHUB_URL=str(directory), CRAWLHUB_LOOP="fiber")


async def served_start_urls(redis_url: str, unique_name: str, *entries: str | bytes,
                            want: int) -> tuple[str, list[str], int]:
    """``entries`` pushed to a scrapy-redis start URLs key, a scheduler reading it: the
    key, the URLs it served (once ``want`` are and nothing is pending) and the entries
    left on the key."""
    import redis.asyncio as aioredis

    key = f"{unique_name}:start_urls"
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.rpush(key, *entries)
        scheduler = open_scheduler({"CRAWLHUB_URL": redis_url,
                                    "CRAWLHUB_PREFIX": f"{unique_name}:",
                                    "REDIS_START_URLS_KEY": key})
        try:
            got: list[str] = []

            def more() -> bool:
                request = scheduler.next_request()
                if request is not None:
                    got.append(request.url)
                return len(got) >= want and not scheduler.has_pending_requests()

            await wait_for(more, f"{want} start URLs served")
        finally:
            scheduler.close("finished")
        return key, got, await client.llen(key)
    finally:
        await client.delete(key)
        await client.aclose()


async def test_start_urls_pushed_to_a_scrapy_redis_key_are_crawled(
        redis_url: str, unique_name: str) -> None:
    _, got, left = await served_start_urls(
        redis_url, unique_name, "http://127.0.0.1/s/0", '{"url": "http://127.0.0.1/s/1"}',
        want=2)
    assert sorted(got) == ["http://127.0.0.1/s/0", "http://127.0.0.1/s/1"]
    assert left == 0


async def test_hostile_entries_on_the_start_urls_key_are_logged_and_dropped(
        redis_url: str, unique_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever is pushed to scrapy-redis's start URLs key, the scheduler goes on: bytes
    that are no text, broken JSON, a JSON list, a task that makes no request and an entry
    of a megabyte are each refused with a log line naming the key; the good URLs around
    them are served."""
    import logging

    caplog.set_level(logging.ERROR, logger="crawlhub.contrib.scrapy")
    key, got, left = await served_start_urls(
        redis_url, unique_name, b"\xff\xfe\x00garbage", "{not json", "[1, 2]",
        "http://127.0.0.1/s/0", '{"url": 5}', "x" * (1 << 20),
        '{"url": "http://127.0.0.1/s/1"}', want=2)
    assert sorted(got) == ["http://127.0.0.1/s/0", "http://127.0.0.1/s/1"]
    assert left == 0
    refused = [r.getMessage() for r in caplog.records if "start URL from" in r.getMessage()]
    assert len(refused) == 5, refused
    assert all(key in line for line in refused)
    assert any("1048576 characters" in line for line in refused)


async def open_on_engines_loop(settings: dict[str, Any],
                               monkeypatch: pytest.MonkeyPatch) -> Scheduler:
    """A scheduler opened as Scrapy's engine opens it on the asyncio reactor: from the
    engine's loop, with a real ``ExecutionEngine`` (its slot a stand-in); this process runs
    no reactor, so the running loop is taken for the reactor's."""
    import asyncio

    from scrapy.core.engine import ExecutionEngine
    from scrapy.utils.defer import maybe_deferred_to_future

    from crawlhub.contrib.scrapy import scheduler as module

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(module, "running_engine_loop", lambda: loop)
    crawler = get_crawler(Spider, {"SCHEDULER": "crawlhub.contrib.scrapy.Scheduler",
                                   "DUPEFILTER_CLASS": "crawlhub.contrib.scrapy.DupeFilter",
                                   "CONCURRENT_REQUESTS": 4, **settings})
    spider = Spider.from_crawler(crawler)
    crawler.spider = spider
    engine = ExecutionEngine(crawler, lambda _: None)
    engine._slot = _Slot()  # type: ignore[assignment]
    crawler.engine = engine
    scheduler = Scheduler.from_crawler(crawler)
    opened = scheduler.open(spider)
    assert opened is not None, "the engine's loop must not be blocked: open is awaited"
    await maybe_deferred_to_future(opened)
    assert scheduler.loop is not None and scheduler.loop.inline
    return scheduler


async def test_on_the_engines_loop_order_length_and_pending_work_are_scrapys(
        storage: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On the engine's own loop (CRAWLHUB_LOOP's default under the asyncio reactor) the
    scheduler never blocks it: a request enqueued is served once the worker has stored it
    (one turn of the loop), in Scrapy's order (priority, then newest first), ``len``
    counts every pending request of the crawl, and close stores what is left."""
    from scrapy.utils.defer import maybe_deferred_to_future

    scheduler = await open_on_engines_loop(storage, monkeypatch)
    try:
        assert not scheduler.has_pending_requests() and len(scheduler) == 0
        for i, url in enumerate(urls(40)):
            assert scheduler.enqueue_request(scrapy.Request(url, priority=i % 3))
        assert not scheduler.enqueue_request(scrapy.Request(urls(1)[0]))  # a duplicate
        assert scheduler.has_pending_requests()
        await wait_for(lambda: len(scheduler) == 40, "len() of 40 pending requests")
        got: list[scrapy.Request] = []

        def more() -> bool:
            request = scheduler.next_request()
            if request is not None:
                got.append(request)
            return len(got) == 40 and not scheduler.has_pending_requests()

        await wait_for(more, "all 40 requests served", every=0.001)
        assert scheduler.next_request() is None
        expected = sorted(urls(40), key=lambda u: (-(int(u.rsplit("/", 1)[1]) % 3),
                                                   -int(u.rsplit("/", 1)[1])))
        assert [r.url for r in got] == expected
        await wait_for(lambda: len(scheduler) == 0, "len() of 0 once all are running")
        # a request enqueued just before close is stored, not lost
        assert scheduler.enqueue_request(scrapy.Request("http://127.0.0.1/late"))
    finally:
        closed = scheduler.close("shutdown")
        assert closed is not None
        await maybe_deferred_to_future(closed)
    assert scheduler.loop is None
    again = open_scheduler({**storage, "SCHEDULER_PERSIST": "True"})
    try:
        request = again.next_request()
        assert request is not None and request.url == "http://127.0.0.1/late"
    finally:
        again.close("finished")


def test_a_wake_up_from_another_thread_reaches_the_engines_loop_at_once() -> None:
    """The item writer's thread wakes the scheduler (its commits free finished requests):
    on the engine's loop that call must wake a loop asleep in its selector, not wait for
    the loop's next event (nothing else is scheduled here: it would never come)."""
    import asyncio
    import threading

    from crawlhub.contrib.scrapy.loop import EngineLoop

    late: list[bool] = []

    async def main() -> str:
        loop = asyncio.get_running_loop()
        on_loop = EngineLoop(loop)
        woken: asyncio.Future[str] = loop.create_future()
        served = threading.Event()

        def guard() -> None:  # 10 s on: the wake-up never came; wake the loop to end
            if not served.wait(10):
                late.append(True)
                loop.call_soon_threadsafe(lambda: None)

        threading.Thread(target=guard, daemon=True).start()
        threading.Timer(0.05, on_loop.call_soon, (woken.set_result, "woken")).start()
        result = await woken  # nothing else can wake this loop
        served.set()
        return result

    assert asyncio.run(main()) == "woken"
    assert not late, "the loop slept through a wake-up from another thread"


async def test_on_the_engines_loop_items_of_one_turn_cross_to_the_writer_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """crawlhub's ItemSink under the asyncio reactor: the items the engine hands over in
    one turn of its loop go to the writer's thread as one group (one hand-off, not one
    per item), and each ``process_item`` still returns only once its item is committed,
    in order, every item once."""
    import asyncio
    import sqlite3

    from crawlhub.contrib.scrapy import items as module
    from crawlhub.contrib.scrapy.items import ItemSink

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(module, "running_engine_loop", lambda: loop)
    crawler = get_crawler(Spider, {"CRAWLHUB_ITEMS": str(tmp_path / "items.db")})
    sink = ItemSink.from_crawler(crawler)
    sink.open_spider()
    assert sink.loop is not None
    handoffs: list[int] = []
    submit = sink.loop.submit

    def counted(coro: Any) -> Any:
        handoffs.append(1)
        return submit(coro)

    monkeypatch.setattr(sink.loop, "submit", counted)
    seen: list[int] = []

    async def one(n: int) -> dict[str, Any]:
        item = await sink.process_item({"url": f"http://127.0.0.1/i/{n}", "n": n})
        seen.append(sink.committed_through())  # committed by the time it returns
        return item

    try:
        got = await asyncio.gather(*(one(n) for n in range(50)))
        assert [item["n"] for item in got] == list(range(50))
        assert len(handoffs) == 1, f"{len(handoffs)} hand-offs to the writer for one turn"
        assert sink.received == sink.committed_through() == 50 and min(seen) == 50
        await one(50)  # a later turn: a group of its own
        assert len(handoffs) == 2 and sink.committed_through() == 51
    finally:
        sink.close_spider()
    with sqlite3.connect(tmp_path / "items.db") as db:
        (count,) = db.execute("SELECT count(*) FROM items").fetchone()
    assert count == 51

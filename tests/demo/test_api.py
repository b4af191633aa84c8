"""The demo's paged JSON API: news oldest first with a total that grows with the clock,
details by id, orders by time window, and clear 4xx answers for bad parameters."""

from __future__ import annotations

from datetime import datetime

from crawlhub.demo.api import DATE_FORMAT, ORDER_EVERY
from tests.demo.conftest import START, serve_demo
from tests.helpers import FakeClock


def when(text: str) -> float:
    return datetime.strptime(text, DATE_FORMAT).timestamp()


async def test_news_pages_are_oldest_first_with_ids_dates_and_the_total() -> None:
    async with serve_demo(items=50, history_days=10) as demo:
        status, body, _ = await demo.get("/api/news?offset=45&limit=10")
    assert status == 200 and body["code"] == 0
    data = body["data"]
    assert data["total"] == 50
    assert [i["id"] for i in data["items"]] == [46, 47, 48, 49, 50]  # clamped at the total
    dates = [when(i["publish_time"]) for i in data["items"]]
    assert dates == sorted(dates)
    assert dates[-1] == START  # the newest item is dated at the demo's start
    assert all(i["title"] and i["channel"] for i in data["items"])


async def test_news_total_grows_as_the_clock_moves_and_new_items_are_newest() -> None:
    clock = FakeClock(START)
    async with serve_demo(items=100, grow_every=2.0, clock=clock) as demo:
        _, before, _ = await demo.get("/api/news?offset=0&limit=1")
        clock.advance(11)
        _, after, _ = await demo.get("/api/news?offset=100&limit=10")
        _, detail, _ = await demo.get("/api/news/105")
        too_new = await demo.get("/api/news/106")
    assert before["data"]["total"] == 100
    assert after["data"]["total"] == 105
    new = after["data"]["items"]
    assert [i["id"] for i in new] == [101, 102, 103, 104, 105]
    assert [when(i["publish_time"]) for i in new] == [START + 2 * k for k in range(1, 6)]
    assert detail["data"]["id"] == 105
    assert too_new[0] == 404  # not published yet


async def test_a_fixed_total_never_grows() -> None:
    clock = FakeClock(START)
    async with serve_demo(items=10, grow_every=0, clock=clock) as demo:
        clock.advance(3600)
        _, body, _ = await demo.get("/api/news")
    assert body["data"]["total"] == 10


async def test_the_same_start_and_clock_give_the_same_answers() -> None:
    async with serve_demo() as a, serve_demo() as b:
        for path in ("/api/news?offset=900&limit=100", "/api/news/42",
                     "/api/orders?pageIndex=2&pageSize=7"):
            assert (await a.get(path))[1] == (await b.get(path))[1], path


async def test_news_detail_carries_the_list_fields_and_a_body() -> None:
    async with serve_demo(items=20) as demo:
        _, listed, _ = await demo.get("/api/news?offset=6&limit=1")
        status, detail, _ = await demo.get("/api/news/7")
        missing = await demo.get("/api/news/0")
        bad = await demo.get("/api/news/seven")
    assert status == 200
    item = detail["data"]
    assert {k: item[k] for k in listed["data"]["items"][0]} == listed["data"]["items"][0]
    assert item["body"] and item["author"]
    assert missing[0] == bad[0] == 404
    assert missing[1]["code"] == 404 and "ids run 1..20" in missing[1]["msg"]


async def test_bad_paging_parameters_are_400_with_a_json_reason() -> None:
    async with serve_demo() as demo:
        negative = await demo.get("/api/news?offset=-1&limit=10")
        text = await demo.get("/api/news?offset=0&limit=ten")
        huge = await demo.get("/api/news?offset=0&limit=100000")
    assert negative[0] == 400 and "offset=-1 must be >= 0" in negative[1]["msg"]
    assert text[0] == 400 and "limit='ten' is not an integer" in text[1]["msg"]
    assert huge[0] == 200 and len(huge[1]["data"]["items"]) == 500  # capped


async def test_orders_are_paged_inside_a_time_window_posted_as_json() -> None:
    clock = FakeClock(START)
    hour_start = (START // 3600 - 2) * 3600
    window = {"startTime": datetime.fromtimestamp(hour_start).strftime(DATE_FORMAT),
              "endTime": datetime.fromtimestamp(hour_start + 3600).strftime(DATE_FORMAT)}
    async with serve_demo(clock=clock) as demo:
        pages = [await demo.post("/api/orders", {**window, "pageIndex": p, "pageSize": 5})
                 for p in (1, 2, 3, 4)]
        _, one, _ = await demo.get(f"/api/orders/{int(hour_start // ORDER_EVERY)}")
        future = await demo.get(f"/api/orders/{int(START // ORDER_EVERY) + 1}")
    per_hour = 3600 // ORDER_EVERY
    assert all(status == 200 and body["data"]["total"] == per_hour for status, body in pages)
    rows = [row for _, body in pages for row in body["data"]["list"]]
    assert [len(body["data"]["list"]) for _, body in pages] == [5, 5, per_hour - 10, 0]
    created = [when(r["createdAt"]) for r in rows]
    assert created == [hour_start + k * ORDER_EVERY for k in range(per_hour)]
    assert one["data"] == rows[0]
    assert future[0] == 404


async def test_orders_window_reaching_past_now_holds_only_orders_made_so_far() -> None:
    clock = FakeClock(START)
    async with serve_demo(clock=clock) as demo:
        _, body, _ = await demo.get(f"/api/orders?startTime={int(START - 1800)}"
                                    f"&endTime={int(START + 7200)}&pageSize=100")
        bad = await demo.post("/api/orders", {"startTime": "yesterday"})
    assert all(when(r["createdAt"]) <= START for r in body["data"]["list"])
    assert body["data"]["total"] == len(body["data"]["list"]) >= 1800 // ORDER_EVERY
    assert bad[0] == 400 and "startTime" in bad[1]["msg"]

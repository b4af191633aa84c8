"""Frontier conformance: the same behaviour on the SQLite and the Redis store."""

from __future__ import annotations

import asyncio

import pytest

from crawlhub.core.errors import FrontierError
from crawlhub.frontier import Seed
from tests.helpers import FakeClock

from .conftest import DAY, MakeFrontier


def seeds(*urls: str) -> list[Seed]:
    return [Seed(u) for u in urls]


async def counts(frontier, segment: int | None = None) -> dict:  # type: ignore[no-untyped-def]
    rows = await frontier.stats()
    if segment is None:
        segment = frontier.current_segment()
    return next((r for r in rows if r["segment"] == segment), {})


# ------------------------------------------------------------------ admission
async def test_a_url_is_admitted_once_per_segment(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    assert await f.admit(seeds("http://a.com/1", "http://a.com/2")) == [True, True]
    assert await f.admit(seeds("http://a.com/1")) == [False]


async def test_variants_of_one_page_are_duplicates(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    variants = seeds(
        "https://Shop.example.com/item?id=7&color=red",
        "https://shop.example.com:443/item?color=red&id=7#reviews",
        "https://shop.example.com/item?id=7&color=red&utm_source=mail&_=1700000000123",
        "https://shop.example.com/item?callback=jQuery123&color=red&id=7",
    )
    assert await f.admit(variants) == [True, False, False, False]
    assert (await counts(f))["duplicates"] == 3


async def test_admitted_seeds_carry_their_key_and_segment(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    seed = Seed("http://a.com/x?b=2&a=1#top")
    await f.admit([seed])
    assert seed.key == "http://a.com/x?a=1&b=2"
    assert seed.segment == f.current_segment()


async def test_a_duplicate_inside_one_batch_is_admitted_once(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    assert await f.admit(seeds("http://a.com/1", "http://a.com/1#x", "http://a.com/1")) == [
        True,
        False,
        False,
    ]


async def test_the_next_segment_admits_the_key_again(
    make_frontier: MakeFrontier, clock: FakeClock
) -> None:
    f = await make_frontier(segment="1d")
    assert await f.admit(seeds("http://a.com/daily")) == [True]
    clock.advance(DAY)
    assert await f.admit(seeds("http://a.com/daily")) == [True]
    assert await f.admit(seeds("http://a.com/daily")) == [False]
    assert [r["admitted"] for r in await f.stats()] == [1, 1]


async def test_segment_length_is_configurable(make_frontier: MakeFrontier, clock: FakeClock) -> None:
    f = await make_frontier(segment="3d")
    start = f.segments.start_of(f.current_segment())
    clock.set(start + 1)
    assert await f.admit(seeds("http://a.com/x")) == [True]
    clock.set(start + 2.9 * DAY)
    assert await f.admit(seeds("http://a.com/x")) == [False]
    clock.set(start + 3 * DAY)
    assert await f.admit(seeds("http://a.com/x")) == [True]


async def test_duplicates_are_counted_per_segment(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    await f.admit(seeds("http://a.com/1", "http://a.com/1", "http://a.com/2", "http://a.com/2"))
    row = await counts(f)
    assert (row["admitted"], row["duplicates"], row["pending"]) == (2, 2, 2)


@pytest.mark.parametrize("exact", [True, False])
async def test_duplicates_reads_which_keys_are_admitted_and_counts_them(
        make_frontier: MakeFrontier, clock: FakeClock, exact: bool) -> None:
    f = await make_frontier(exact=exact)
    await f.admit(seeds("http://a.com/1", "http://a.com/2"))
    entries = f.entries(seeds("http://a.com/2", "http://a.com/3", "http://a.com/1#x"), clock())
    assert await f.duplicates(entries) == [True, False, True]
    assert await f.duplicates([]) == []
    row = await counts(f)
    assert (row["admitted"], row["duplicates"], row["pending"]) == (2, 2, 2)
    # a read: the unknown key is still new to admit, and nothing else was stored
    assert await f.admit(seeds("http://a.com/3")) == [True]
    # the next segment knows none of them
    clock.advance(DAY)
    later = f.entries(seeds("http://a.com/1"), clock())
    assert await f.duplicates(later) == [False]


# ------------------------------------------------------------------ leasing
async def test_lease_takes_higher_priority_first_then_admission_order(
    make_frontier: MakeFrontier,
) -> None:
    f = await make_frontier(cache_size=0)
    await f.admit(
        [
            Seed("http://a.com/low1", priority=-1),
            Seed("http://a.com/mid1"),
            Seed("http://a.com/high", priority=5),
            Seed("http://a.com/mid2"),
            Seed("http://a.com/low2", priority=-1),
        ]
    )
    leased = await f.lease(5, 60)
    assert [s.url.rsplit("/", 1)[1] for s in leased] == ["high", "mid1", "mid2", "low1", "low2"]


async def test_a_leased_seed_keeps_its_fields(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    seed = Seed("http://a.com/api", method="POST", body=b"\x00q=1", headers={"X-A": "1"},
                meta={"depth": 2}, priority=3)
    await f.admit([seed])
    (got,) = await f.lease(1, 60)
    assert (got.url, got.method, got.body, got.headers, got.meta, got.priority) == (
        "http://a.com/api", "POST", b"\x00q=1", {"X-A": "1"}, {"depth": 2}, 3
    )
    assert got.attempts == 1 and got.key == "http://a.com/api"


async def test_lease_never_deletes_and_finish_archives(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    await f.admit(seeds("http://a.com/1", "http://a.com/2"))
    (first, second) = await f.lease(2, 60)
    row = await counts(f)
    assert (row["pending"], row["leased"]) == (0, 2)
    assert await f.finish(first, "ok")
    assert await f.finish(second, "failed")
    row = await counts(f)
    assert (row["admitted"], row["pending"], row["leased"], row["done"], row["failed"]) == (
        2, 0, 0, 1, 1
    )
    # archived seeds still count for dedup in their segment
    assert await f.admit(seeds("http://a.com/1", "http://a.com/2")) == [False, False]
    assert await f.lease(1, 60) == []


async def test_without_archive_a_finished_seed_drops_its_record_and_stays_known(
        make_frontier: MakeFrontier, backend: str) -> None:
    f = await make_frontier(archive=False, cache_size=0)
    await f.admit(seeds("http://a.com/1", "http://a.com/2"))
    (first,) = await f.lease(1, 60)
    assert await f.finish(first, "ok")
    # the record is gone on Redis (the embedded table keeps its rows: its filter's log)
    held = await f.store.admitted_by(first.segment, first.key)  # type: ignore[arg-type]
    stored = await f.store.redis.hexists(  # type: ignore[attr-defined]
        f.store.stem + f"{first.segment}:seeds", first.key) if backend == "redis" else None
    assert held is None
    assert stored in (None, False, 0)
    assert not await f.finish(first, "ok")  # finishing it again changes nothing
    assert await f.admit(seeds("http://a.com/1")) == [False]  # the filter remembers it
    row = await counts(f)
    assert (row["done"], row["pending"]) == (1, 1)


async def test_archive_off_refuses_exact() -> None:
    from pydantic import ValidationError

    from crawlhub.frontier.config import FrontierConfig

    with pytest.raises(ValidationError, match="archive: false"):
        FrontierConfig.model_validate({"archive": False, "exact": True})


async def test_finish_retry_returns_the_seed_to_pending(make_frontier: MakeFrontier) -> None:
    f = await make_frontier(cache_size=0)
    await f.admit(seeds("http://a.com/1"))
    (seed,) = await f.lease(1, 60)
    assert await f.finish(seed, "retry")
    (again,) = await f.lease(1, 60)
    assert again.url == seed.url and again.attempts == 2


async def test_finish_retry_with_delay_waits(make_frontier: MakeFrontier, clock: FakeClock) -> None:
    f = await make_frontier(cache_size=0)
    await f.admit(seeds("http://a.com/1"))
    (seed,) = await f.lease(1, 60)
    await f.finish(seed, "retry", delay=30)
    assert await f.lease(1, 60) == []
    assert await f.store.next_due(clock()) == pytest.approx(clock() + 30)
    clock.advance(30)
    assert [s.url for s in await f.lease(1, 60)] == ["http://a.com/1"]


async def test_finishing_twice_changes_nothing(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    await f.admit(seeds("http://a.com/1"))
    (seed,) = await f.lease(1, 60)
    assert await f.finish(seed, "ok") is True
    assert await f.finish(seed, "failed") is False
    assert await f.finish(seed, "retry") is False
    row = await counts(f)
    assert (row["done"], row["failed"], row["pending"]) == (1, 0, 0)


async def test_finish_many_settles_each_seed_in_one_call(make_frontier: MakeFrontier) -> None:
    f = await make_frontier(cache_size=0)
    await f.admit(seeds("http://a.com/1", "http://a.com/2", "http://a.com/3", "http://a.com/4"))
    a, b, c, d = await f.lease(4, 60)
    assert await f.finish(d, "ok")
    flags = await f.finish_many([(a, "ok"), (b, "failed"), (c, "retry"), (d, "ok")])
    assert flags == [True, True, True, False]  # d was finished already
    row = await counts(f)
    assert (row["done"], row["failed"], row["pending"], row["leased"]) == (2, 1, 1, 0)
    assert [s.url for s in await f.lease(4, 60)] == [c.url]
    assert await f.finish_many([]) == []


async def test_an_expired_lease_returns_by_itself(make_frontier: MakeFrontier, clock: FakeClock) -> None:
    f = await make_frontier(cache_size=0)
    await f.admit(seeds("http://a.com/1"))
    (seed,) = await f.lease(1, 10)
    assert await f.lease(1, 10) == []
    clock.advance(10.001)
    assert (await counts(f))["pending"] == 1
    (again,) = await f.lease(1, 10)
    assert again.url == seed.url and again.attempts == 2


async def test_finish_of_an_expired_lease_still_archives(
    make_frontier: MakeFrontier, clock: FakeClock
) -> None:
    f = await make_frontier(cache_size=0)
    await f.admit(seeds("http://a.com/1"))
    (seed,) = await f.lease(1, 10)
    clock.advance(60)
    assert await f.finish(seed, "ok")
    assert await f.lease(1, 10) == []


async def test_a_future_not_before_waits_in_its_own_segment(
    make_frontier: MakeFrontier, clock: FakeClock
) -> None:
    f = await make_frontier(segment="1d")
    later = clock() + 2 * DAY
    seed = Seed("http://a.com/later", not_before=later)
    assert await f.admit([seed]) == [True]
    assert seed.segment == f.current_segment() + 2
    # the same URL now, in the current segment, is a different admission
    assert await f.admit(seeds("http://a.com/later")) == [True]
    (now_seed,) = await f.lease(5, 60)
    assert now_seed.segment == f.current_segment()
    await f.finish(now_seed, "ok")
    assert await f.store.next_due(clock()) == pytest.approx(later)
    clock.set(later)
    (due,) = await f.lease(5, 60)
    assert due.segment == seed.segment


async def test_not_before_inside_the_segment_delays_dispatch(
    make_frontier: MakeFrontier, clock: FakeClock
) -> None:
    f = await make_frontier(segment="1w", cache_size=0)
    await f.admit([Seed("http://a.com/soon", not_before=clock() + 60)])
    assert await f.lease(1, 60) == []
    clock.advance(60)
    assert len(await f.lease(1, 60)) == 1


# ------------------------------------------------------------------ the in-memory cache
async def test_the_cache_refills_from_the_store_in_batches(make_frontier: MakeFrontier) -> None:
    f = await make_frontier(cache_size=10)
    await f.admit(seeds(*(f"http://a.com/{i}" for i in range(25))))
    claims = 0
    claim = f.store.claim

    async def counting_claim(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal claims
        claims += 1
        return await claim(*args, **kwargs)

    f.store.claim = counting_claim  # type: ignore[method-assign]
    got = [s.url for _ in range(25) for s in await f.lease(1, 60)]
    assert got == [f"http://a.com/{i}" for i in range(25)]
    assert claims == 3
    assert await f.lease(1, 60) == []


async def test_cached_seeds_are_leased_in_the_store(make_frontier: MakeFrontier) -> None:
    f = await make_frontier(cache_size=10)
    await f.admit(seeds(*(f"http://a.com/{i}" for i in range(5))))
    await f.lease(1, 60)
    assert (await counts(f))["leased"] == 5  # 1 handed out, 4 held by the cache


async def test_close_gives_cached_seeds_back(make_frontier: MakeFrontier) -> None:
    f = await make_frontier(cache_size=10)
    await f.admit(seeds(*(f"http://a.com/{i}" for i in range(5))))
    await f.lease(1, 60)
    await f.close()
    g = await make_frontier(cache_size=0)
    assert len(await g.lease(10, 60)) == 4


async def test_a_cached_seed_whose_store_lease_ran_out_is_not_served(
    make_frontier: MakeFrontier, clock: FakeClock
) -> None:
    f = await make_frontier(cache_size=10)
    g = await make_frontier(cache_size=0)
    await f.admit(seeds("http://a.com/1", "http://a.com/2"))
    await f.lease(1, 10)  # caches the second with a 20 s store lease
    clock.advance(25)
    taken = await g.lease(5, 60)  # the leases ran out: another consumer may take both
    assert len(taken) == 2
    assert await f.lease(5, 60) == []


# ------------------------------------------------------------------ the hub's admit_task
async def test_admit_task_gates_tasks_with_a_url(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    assert await f.admit_task({"task_src": 1}) is None
    assert await f.admit_task({"url": "http://a.com/p?id=1", "task_uuid": "u1"}) is True
    assert await f.admit_task({"url": "http://a.com/p?id=1#x", "task_uuid": "u2"}) is False
    row = await counts(f)
    assert (row["admitted"], row["dispatched"], row["duplicates"], row["pending"]) == (1, 1, 1, 0)
    assert await f.lease(5, 60) == []


async def test_admit_task_reads_the_configured_url_field(make_frontier: MakeFrontier) -> None:
    f = await make_frontier(url_field="detail_url")
    assert await f.admit_task({"url": "http://a.com/"}) is None
    assert await f.admit_task({"detail_url": "http://a.com/d"}) is True


async def test_admit_tasks_batches(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    tasks: list[dict[str, object]] = [
        {"url": "http://a.com/1"}, {"x": 1}, {"url": "http://a.com/1#b"}, {"url": "http://a.com/2"}
    ]
    assert await f.admit_tasks(tasks) == [True, None, False, True]


# ------------------------------------------------------------------ exactness and growth
async def test_exact_mode_admits_what_the_filter_wrongly_calls_seen(
    make_frontier: MakeFrontier,
) -> None:
    # a filter at fp 0.5 (one hash, few bits) calls many new keys seen
    urls = [f"http://a.com/{i}" for i in range(300)]
    loose = await make_frontier("loose", expected_items=1000, fp_rate=0.5)
    exact = await make_frontier("exact", expected_items=1000, fp_rate=0.5, exact=True)
    assert not all([(await loose.admit(seeds(u)))[0] for u in urls])
    assert all([(await exact.admit(seeds(u)))[0] for u in urls])
    assert await exact.admit(seeds(*urls)) == [False] * 300
    assert (await counts(exact))["duplicates"] == 300


async def test_the_filter_grows_past_expected_items_without_forgetting(
    make_frontier: MakeFrontier,
) -> None:
    f = await make_frontier(expected_items=100, fp_rate=0.01)
    urls = [f"http://a.com/{i}" for i in range(2000)]
    admitted = sum(await f.admit(seeds(*urls)))
    assert admitted >= 2000 * (1 - 0.01)  # the bound holds for the grown filter
    assert await f.admit(seeds(*urls)) == [False] * 2000  # no false negatives


# ------------------------------------------------------------------ many processes, restarts
async def test_two_frontiers_on_one_store_never_admit_a_key_twice(
    make_frontier: MakeFrontier,
) -> None:
    a = await make_frontier()
    b = await make_frontier()
    urls = [f"http://a.com/{i}" for i in range(400)]
    ra, rb = await asyncio.gather(a.admit(seeds(*urls)), b.admit(seeds(*reversed(urls))))
    rb.reverse()
    assert all(x != y for x, y in zip(ra, rb, strict=True))
    assert await a.admit(seeds(*urls)) == [False] * 400
    assert await b.admit(seeds(*urls)) == [False] * 400


async def test_a_reopened_frontier_remembers_its_keys(make_frontier: MakeFrontier) -> None:
    a = await make_frontier()
    urls = [f"http://a.com/{i}" for i in range(100)]
    await a.admit(seeds(*urls))
    await a.close()
    b = await make_frontier()
    assert await b.admit(seeds(*urls, "http://a.com/new")) == [False] * 100 + [True]


async def test_a_crash_without_snapshot_loses_no_admission(make_frontier: MakeFrontier) -> None:
    a = await make_frontier()
    await a.admit(seeds("http://a.com/before"))
    await a.snapshot()
    await a.admit(seeds("http://a.com/after"))
    await a.store.close()  # no close(): no final snapshot, as after kill -9
    b = await make_frontier()
    assert await b.admit(seeds("http://a.com/before", "http://a.com/after")) == [False, False]
    assert sorted(s.url for s in await b.lease(5, 60)) == [
        "http://a.com/after",
        "http://a.com/before",
    ]


# ------------------------------------------------------------------ waiting
async def test_wait_ready_wakes_on_an_admission(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    waiter = asyncio.create_task(f.wait_ready(30))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await f.admit(seeds("http://a.com/1"))
    assert await asyncio.wait_for(waiter, 10) is True


async def test_wait_ready_sleeps_until_a_waiting_seed_opens(make_frontier: MakeFrontier) -> None:
    import time

    f = await make_frontier(clock_=time.time, segment="1w", cache_size=0)
    await f.admit([Seed("http://a.com/1", not_before=time.time() + 0.3)])
    checks = 0
    next_due = f.store.next_due

    async def counting(now: float) -> float | None:
        nonlocal checks
        checks += 1
        return await next_due(now)

    f.store.next_due = counting  # type: ignore[method-assign]
    assert await f.wait_ready(20) is True
    assert checks <= 3  # one look, one timed sleep, one look: no polling loop
    assert len(await f.lease(1, 60)) == 1


async def test_wait_ready_times_out_when_nothing_is_owed(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    assert await f.wait_ready(0.2) is False


# ------------------------------------------------------------------ stats and pruning
async def test_stats_are_per_segment(make_frontier: MakeFrontier, clock: FakeClock) -> None:
    f = await make_frontier()
    await f.admit(seeds("http://a.com/1", "http://a.com/2", "http://a.com/2"))
    (seed, _) = await f.lease(2, 3 * DAY)
    await f.finish(seed, "ok")
    clock.advance(DAY)
    await f.admit(seeds("http://a.com/1"))
    await f.admit_task({"url": "http://a.com/3"})
    first, second = await f.stats()
    assert second["segment"] == first["segment"] + 1
    pick = ("admitted", "duplicates", "pending", "leased", "done", "failed", "dispatched")
    assert [first[k] for k in pick] == [2, 1, 0, 1, 1, 0, 0]
    assert [second[k] for k in pick] == [2, 0, 1, 0, 0, 0, 1]
    assert first["label"] == "2023-11-14"


async def test_prune_drops_old_finished_segments_only(
    make_frontier: MakeFrontier, clock: FakeClock
) -> None:
    f = await make_frontier(cache_size=0)
    await f.admit(seeds("http://a.com/done"))
    (seed,) = await f.lease(1, 60)
    await f.finish(seed, "ok")
    clock.advance(DAY)
    await f.admit(seeds("http://a.com/owed"))
    clock.advance(DAY)
    first = f.current_segment() - 2
    assert await f.store.prune(f.current_segment()) == [first]
    assert [r["segment"] for r in await f.stats()] == [first + 1]


# ------------------------------------------------------------------ misuse
async def test_finish_needs_a_seed_from_this_frontier(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    with pytest.raises(FrontierError, match="has no segment/key"):
        await f.finish(Seed("http://a.com/"), "ok")
    with pytest.raises(FrontierError, match="outcome"):
        await f.finish(Seed("http://a.com/"), "maybe")  # type: ignore[arg-type]


async def test_lease_checks_its_arguments(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    with pytest.raises(FrontierError, match="n must be"):
        await f.lease(0)
    with pytest.raises(FrontierError, match="visibility_timeout"):
        await f.lease(1, 0)

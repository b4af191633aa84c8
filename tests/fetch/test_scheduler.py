"""The request scheduler on virtual time: serial gaps, registration order, caps, token bucket."""

from __future__ import annotations

import asyncio
import random

import pytest

from crawlhub.core.errors import CancelledError
from crawlhub.fetch import CancellationToken, RequestScheduler
from tests.helpers import FakeClock, wait_for


def serial(clock: FakeClock, low: float = 5.0, high: float = 20.0, **kw: object) -> RequestScheduler:
    return RequestScheduler(mode="serial", rate_min=low, rate_max=high, clock=clock,
                            rng=random.Random(7), **kw)  # type: ignore[arg-type]


async def test_serial_gaps_are_drawn_uniformly_from_the_rate_range() -> None:
    clock = FakeClock()
    scheduler = serial(clock, 5.0, 20.0)
    for _ in range(30):
        async with scheduler.slot("http://api.test/items", job_code="j"):
            pass
    lane = scheduler.lane("*")
    assert lane is not None
    grants = [t for t, _ in lane.grants]
    gaps = [b - a for a, b in zip(grants, grants[1:], strict=False)]
    assert clock.sleeps == pytest.approx(gaps)
    assert all(5.0 <= g <= 20.0 for g in gaps)
    assert len({round(g, 6) for g in gaps}) > 20  # random, not a constant


async def test_the_first_request_goes_at_once() -> None:
    clock = FakeClock()
    scheduler = serial(clock)
    async with scheduler.slot("http://api.test/", job_code="j") as slot:
        assert slot.waited == 0
    assert clock.sleeps == []


@pytest.mark.parametrize(("low", "high"), [(20.0, 5.0), (1.5, 1.0)])
def test_rate_min_above_rate_max_is_a_value_error_saying_so(low: float, high: float) -> None:
    with pytest.raises(ValueError) as err:
        RequestScheduler(rate_min=low, rate_max=high)
    text = str(err.value)
    assert f"rate_min ({low:g}s) is greater than" in text
    assert f"rate_max ({high:g}s)" in text
    assert "set rate_min <= rate_max" in text


def test_a_jobs_own_rate_range_is_checked_too() -> None:
    scheduler = RequestScheduler(rate_min=0, rate_max=1)
    with pytest.raises(ValueError, match=r"pipeline\.orders\.rate_min \(9s\) is greater"):
        scheduler.register("orders", rate_min=9, rate_max=3)


async def test_serial_mode_keeps_one_request_in_flight() -> None:
    scheduler = serial(FakeClock(), 0, 0)
    in_flight = 0
    peak = 0

    async def one() -> None:
        nonlocal in_flight, peak
        async with scheduler.slot("http://api.test/", job_code="j"):
            in_flight += 1
            peak = max(peak, in_flight)
            for _ in range(3):
                await asyncio.sleep(0)
            in_flight -= 1

    await asyncio.gather(*(one() for _ in range(10)))
    assert peak == 1


async def test_jobs_sharing_a_scope_go_in_registration_order() -> None:
    scheduler = serial(FakeClock(), 1, 2)
    scheduler.register("first")
    scheduler.register("second")
    order: list[str] = []
    hold = asyncio.Event()

    async def blocker() -> None:
        async with scheduler.slot("http://api.test/", job_code="other"):
            await hold.wait()

    async def request(job: str) -> None:
        async with scheduler.slot("http://api.test/", job_code=job):
            order.append(job)

    first_task = asyncio.create_task(blocker())
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(request("second")) for _ in range(3)]
    tasks += [asyncio.create_task(request("first")) for _ in range(3)]
    await wait_for(lambda: scheduler.waiting == 6, "six requests waiting their turn")
    hold.set()
    await asyncio.gather(first_task, *tasks)
    assert order == ["first"] * 3 + ["second"] * 3
    assert scheduler.jobs == ["first", "second", "other"]


async def test_scope_job_gives_each_job_its_own_lane_and_gap_range() -> None:
    clock = FakeClock()
    scheduler = serial(clock, 5, 20, scope="job")
    scheduler.register("fast", rate_min=1, rate_max=1)
    for _ in range(3):
        async with scheduler.slot("http://a.test/", job_code="fast"):
            pass
    assert clock.sleeps == [1.0, 1.0]
    assert scheduler.lane("job:fast") is not None
    assert scheduler.lane("*") is None


async def test_concurrent_mode_caps_requests_in_flight_per_domain() -> None:
    scheduler = RequestScheduler(mode="concurrent", scope="domain", concurrency=2,
                                 clock=FakeClock())
    in_flight: dict[str, int] = {"a.test": 0, "b.test": 0}
    peak: dict[str, int] = {"a.test": 0, "b.test": 0}
    peak_total = 0
    release = asyncio.Event()

    async def one(domain: str) -> None:
        nonlocal peak_total
        async with scheduler.slot(f"http://{domain}/x", job_code="j"):
            in_flight[domain] += 1
            peak[domain] = max(peak[domain], in_flight[domain])
            peak_total = max(peak_total, sum(in_flight.values()))
            await release.wait()
            in_flight[domain] -= 1

    tasks = [asyncio.create_task(one(d)) for d in ["a.test", "b.test"] * 5]
    await wait_for(lambda: scheduler.waiting == 6, "six requests waiting for a slot")
    assert scheduler.in_flight == 4
    release.set()
    await asyncio.gather(*tasks)
    assert peak == {"a.test": 2, "b.test": 2}
    assert peak_total == 4


@pytest.mark.parametrize("burst", [1, 3])
async def test_concurrent_mode_meters_starts_with_a_token_bucket(burst: int) -> None:
    clock = FakeClock(0.0)
    scheduler = RequestScheduler(mode="concurrent", scope="domain", concurrency=50,
                                 rate_per_second=4.0, burst=burst, clock=clock)

    async def one() -> None:
        async with scheduler.slot("http://a.test/x", job_code="j"):
            pass

    await asyncio.gather(*(one() for _ in range(10)))
    lane = scheduler.lane("domain:a.test")
    assert lane is not None
    starts = sorted(t for t, _ in lane.grants)
    expected = [0.0] * burst + [0.25 * n for n in range(1, 10 - burst + 1)]
    assert starts == pytest.approx(expected)


async def test_cancel_interrupts_the_wait_for_a_turn() -> None:
    scheduler = serial(FakeClock(), 0, 0)
    token = CancellationToken()
    hold = asyncio.Event()

    async def holder() -> None:
        async with scheduler.slot("http://a.test/", job_code="j"):
            await hold.wait()

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)

    async def waiter() -> None:
        async with scheduler.slot("http://a.test/", job_code="j", token=token):
            raise AssertionError("a cancelled waiter must not get a turn")

    waiting = asyncio.create_task(waiter())
    await wait_for(lambda: scheduler.waiting == 1, "the waiter to queue for its turn")
    token.cancel("stop")
    with pytest.raises(CancelledError):
        await asyncio.wait_for(waiting, 5)
    assert scheduler.waiting == 0
    hold.set()
    await held


def test_bad_mode_scope_and_counts_are_value_errors() -> None:
    with pytest.raises(ValueError, match="mode"):
        RequestScheduler(mode="parallel")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scope"):
        RequestScheduler(scope="planet")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        RequestScheduler(concurrency=0)
    with pytest.raises(ValueError, match="rate_min must be a number of seconds >= 0"):
        RequestScheduler(rate_min=-1)

"""Latency and error injection: 500s and 429s (with Retry-After) at the configured rate,
the same sequence for the same seed; robots.txt and /healthz always answer."""

from __future__ import annotations

import pytest

from crawlhub.core.hosts import is_loopback
from crawlhub.demo import DemoConfig, DemoError, parse_latency
from tests.demo.conftest import serve_demo


async def test_an_error_rate_of_one_answers_every_request_with_500_or_429() -> None:
    paths = ["/api/news", "/api/news/1", "/", "/item/1"] * 5
    async with serve_demo(error_rate=1.0) as demo:
        answers = [(path, *await demo.get(path)) for path in paths]
        robots = await demo.get("/robots.txt")
        health = await demo.get("/healthz")
    assert {status for _, status, _, _ in answers} == {500, 429}
    for path, status, body, headers in answers:
        if status == 429:
            assert headers["Retry-After"] == "1"
        if path.startswith("/api/"):  # the API answers JSON even when it fails
            assert body["code"] == status
    assert robots[0] == 200 and health[0] == 200


async def test_the_same_seed_injects_the_same_errors_in_the_same_order() -> None:
    async def statuses(seed: int) -> list[int]:
        async with serve_demo(error_rate=0.3, seed=seed) as demo:
            return [(await demo.get("/api/news?limit=1"))[0] for _ in range(40)]

    first, again, other = await statuses(7), await statuses(7), await statuses(8)
    assert first == again
    assert first != other
    assert {200, 500, 429} <= set(first) | set(other)


async def test_no_error_rate_means_no_errors() -> None:
    async with serve_demo() as demo:
        assert {(await demo.get("/api/news"))[0] for _ in range(20)} == {200}


async def test_latency_is_drawn_inside_the_range_for_every_answer() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # recorded instead of waited
        waits.append(seconds)

    async with serve_demo(latency=(0.01, 0.2), sleep=sleep) as demo:
        for _ in range(10):
            await demo.get("/api/news")
        await demo.get("/")
    assert len(waits) == 11
    assert all(0.01 <= w <= 0.2 for w in waits)
    assert len(set(waits)) > 1


@pytest.mark.parametrize(("text", "expected"), [
    ("0", (0.0, 0.0)), ("0.05", (0.05, 0.05)), ("0.01-0.2", (0.01, 0.2)),
    ("0.01,0.2", (0.01, 0.2)),
])
def test_latency_takes_seconds_or_a_range(text: str, expected: tuple[float, float]) -> None:
    assert parse_latency(text) == expected


@pytest.mark.parametrize("text", ["", "fast", "0.2-0.01", "1-2-3", "-1"])
def test_a_bad_latency_is_an_error_that_shows_the_forms(text: str) -> None:
    with pytest.raises(DemoError, match="latency"):
        parse_latency(text)


def test_a_bad_error_rate_is_refused() -> None:
    with pytest.raises(DemoError, match="error rate 1.5"):
        DemoConfig(error_rate=1.5)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.com", ""])
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)

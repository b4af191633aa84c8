"""robots.txt through the domain gate, on SQLite and real Redis, against a real local
server: rules honoured, one fetch per TTL shared by every gate on the backend, and
hostile files (huge, malformed, unreachable) handled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from crawlhub.agents.politeness import (
    DomainGate,
    Refusal,
    RobotsEntry,
    open_gate,
    origin_of,
)
from tests.agents.servers import _Server
from tests.agents.stores import Backend, backend_fixture  # noqa: F401 - the fixture
from tests.helpers import FakeClock

ROBOTS = b"User-agent: *\nDisallow: /private\n\nUser-agent: nosy\nDisallow: /\n"


class RobotsSite(_Server):
    """Serves ``body`` with ``status`` at /robots.txt and counts the fetches."""

    def __init__(self, body: bytes = ROBOTS, status: int = 200) -> None:
        super().__init__()
        self.body = body
        self.status = status
        self.fetches = 0
        self.agents: list[str] = []
        self.app.router.add_get("/robots.txt", self.robots)

    async def robots(self, request: web.Request) -> web.Response:
        self.fetches += 1
        self.agents.append(request.headers.get("User-Agent", ""))
        return web.Response(body=self.body, status=self.status)


@pytest.fixture
async def site() -> AsyncIterator[RobotsSite]:
    async with RobotsSite() as s:
        yield s


def gate_on(backend: Backend, clock: FakeClock, **kw: object) -> DomainGate:
    return open_gate(backend.url, prefix=backend.prefix, robots=True, clock=clock,
                     sleep=clock.sleep, user_agent="crawlhub-test", **kw)  # type: ignore[arg-type]


async def test_disallowed_paths_are_refused_and_the_rest_allowed(
        backend: Backend, site: RobotsSite, clock: FakeClock) -> None:
    gate = gate_on(backend, clock)
    try:
        assert await gate.allowed(f"{site.url}/public/page") is True
        assert await gate.allowed(f"{site.url}/private/page") is False
        assert await gate.allowed(f"{site.url}/public/page", "nosy") is False
        assert site.agents == ["crawlhub-test"]
    finally:
        await gate.close()


async def test_robots_is_fetched_once_per_ttl_across_two_gates(
        backend: Backend, site: RobotsSite, clock: FakeClock) -> None:
    one = gate_on(backend, clock, robots_ttl=100)
    two = gate_on(backend, clock, robots_ttl=100)
    try:
        assert await one.allowed(f"{site.url}/a") is True
        assert await two.allowed(f"{site.url}/private/b") is False
        clock.advance(99)
        assert await two.allowed(f"{site.url}/c") is True
        assert site.fetches == 1
        site.body = b"User-agent: *\nDisallow: /c\n"
        clock.advance(1)
        assert await two.allowed(f"{site.url}/c") is False  # fetched again by two
        assert await one.allowed(f"{site.url}/c") is False  # read from the shared cache
        assert site.fetches == 2
    finally:
        await one.close()
        await two.close()


async def test_a_gate_without_robots_allows_everything(
        backend: Backend, site: RobotsSite, clock: FakeClock) -> None:
    gate = open_gate(backend.url, prefix=backend.prefix, clock=clock)
    try:
        assert await gate.allowed(f"{site.url}/private/x") is True
        assert site.fetches == 0
    finally:
        await gate.close()


async def test_a_huge_robots_txt_is_read_up_to_the_limit_only(
        backend: Backend, clock: FakeClock) -> None:
    filler = b"# " + b"x" * 97 + b"\n"
    body = b"User-agent: *\nDisallow: /early\n" + filler * 60_000 + b"Disallow: /late\n"
    async with RobotsSite(body) as site:
        gate = gate_on(backend, clock, robots_max_bytes=100_000)
        try:
            assert await gate.allowed(f"{site.url}/early") is False
            assert await gate.allowed(f"{site.url}/late") is True  # past the limit
            assert site.fetches == 1
        finally:
            await gate.close()


@pytest.mark.parametrize("body", [
    b"\x00\xff\xfe garbage \x89PNG\r\n\x1a\n" * 1000,
    b"Disallow /nocolon\nUser-agent\n: :\nAllow:\n" + b"*" * 10_000 + b"\n",
    b"User-agent: *\nDisallow: /" + b"a*" * 20_000 + b"b$\n",  # no backtracking blow-up
    b"<html><body>Not a robots file</body></html>",
])
async def test_a_malformed_robots_txt_blocks_nothing_it_cannot_read(
        backend: Backend, clock: FakeClock, body: bytes) -> None:
    async with RobotsSite(body) as site:
        gate = gate_on(backend, clock)
        try:
            assert await gate.allowed(f"{site.url}/page") is True
        finally:
            await gate.close()


async def test_a_missing_robots_txt_allows_everything(backend: Backend, clock: FakeClock
                                                      ) -> None:
    async with RobotsSite(b"not here", status=404) as site:
        gate = gate_on(backend, clock)
        try:
            assert await gate.allowed(f"{site.url}/private/x") is True
        finally:
            await gate.close()


async def test_a_failing_robots_txt_disallows_everything_until_the_error_ttl(
        backend: Backend, clock: FakeClock) -> None:
    async with RobotsSite(status=503) as site:
        gate = gate_on(backend, clock, robots_error_ttl=60)
        try:
            assert await gate.allowed(f"{site.url}/public") is False
            site.status = 200
            clock.advance(59)
            assert await gate.allowed(f"{site.url}/public") is False
            clock.advance(1)
            assert await gate.allowed(f"{site.url}/public") is True
            assert site.fetches == 2
        finally:
            await gate.close()


async def test_an_unreachable_host_disallows_everything(backend: Backend, clock: FakeClock
                                                       ) -> None:
    async with RobotsSite() as site:
        url = site.url
    gate = gate_on(backend, clock)  # the server is gone: connection refused
    try:
        assert await gate.allowed(f"{url}/public") is False
    finally:
        await gate.close()


async def test_a_refusal_says_whether_the_rules_or_an_unavailable_file_refused(
        backend: Backend, clock: FakeClock) -> None:
    async with RobotsSite() as site, RobotsSite(status=501) as failing:
        gate = gate_on(backend, clock)
        try:
            assert await gate.refusal(f"{site.url}/public") is None
            assert await gate.refusal(f"{site.url}/private") == Refusal(site.url, 200)
            assert str(await gate.refusal(f"{site.url}/private")) == "disallowed by robots.txt"
            answered = await gate.refusal(f"{failing.url}/public")
            assert answered == Refusal(failing.url, 501) and answered.unavailable
            assert "answered 501" in str(answered) and "RFC 9309" in str(answered)
        finally:
            await gate.close()
    async with RobotsSite() as stopped:
        gone = stopped.url
    gate = gate_on(backend, clock)  # the server is gone: connection refused
    try:
        assert await gate.refusal(f"{gone}/public") == Refusal(gone, 0, "connection refused")
    finally:
        await gate.close()


def test_the_origin_keeps_scheme_host_and_port() -> None:
    assert origin_of("HTTPS://Example.com:8443/a/b?c") == "https://example.com:8443"
    assert origin_of("http://example.com/") == "http://example.com"
    assert origin_of("https://example.com:443/a") == "https://example.com"  # one cache entry
    assert origin_of("http://[::1]:8080/") == "http://[::1]:8080"
    with pytest.raises(ValueError, match="absolute"):
        origin_of("example.com/page")


async def test_a_fetch_claimed_by_a_process_that_died_is_taken_over_when_the_claim_ends(
        backend: Backend, site: RobotsSite, clock: FakeClock) -> None:
    gate = gate_on(backend, clock)
    try:
        origin = origin_of(site.url)
        assert gate.robots is not None
        assert await gate.robots.store.robots_claim(origin, clock(), clock() + 30)  # then dies
        start = clock()
        assert await gate.allowed(f"{site.url}/private/x") is False
        assert clock() >= start + 30 and site.fetches == 1
    finally:
        await gate.close()


async def test_a_fetch_under_way_elsewhere_is_waited_for_not_repeated(
        backend: Backend, site: RobotsSite, clock: FakeClock) -> None:
    one = gate_on(backend, clock)
    # Real sleeps, frozen clock: the claim never runs out while two waits.
    two = open_gate(backend.url, prefix=backend.prefix, robots=True, clock=clock)
    try:
        origin = origin_of(site.url)
        assert one.robots is not None and two.robots is not None
        assert await one.robots.store.robots_claim(origin, clock(), clock() + 30)
        waiting = asyncio.create_task(two.allowed(f"{site.url}/private/x"))
        await asyncio.sleep(0.05)
        # The claimer finishes its fetch: the waiter reads it instead of fetching again.
        await one.robots.store.robots_put(origin, RobotsEntry(200, ROBOTS, clock() + 3600),
                                          clock())
        assert await asyncio.wait_for(waiting, 30) is False
        assert site.fetches == 0
    finally:
        await one.close()
        await two.close()


async def test_rules_deep_in_a_large_robots_txt_within_the_limit_are_read(
        backend: Backend, clock: FakeClock) -> None:
    filler = b"# " + b"x" * 97 + b"\n"
    body = b"User-agent: *\n" + filler * 3000 + b"Disallow: /deep\n"  # ~300 KB, many chunks
    async with RobotsSite(body) as site:
        gate = gate_on(backend, clock)
        try:
            assert await gate.allowed(f"{site.url}/deep/page") is False
            assert await gate.allowed(f"{site.url}/shallow") is True
        finally:
            await gate.close()

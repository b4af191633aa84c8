"""The fetcher against a real local API: retries, failure limits, cancellation, request logs."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from crawlhub.core.errors import CancelledError, FetchError
from crawlhub.fetch import (
    CancellationToken,
    CurlCffiClient,
    Fetcher,
    HttpClient,
    JobLog,
    MonotonicTimer,
    Request,
    RequestScheduler,
    Response,
    RetryPolicy,
    TooManyFailures,
)
from tests.helpers import FakeClock, wait_for
from tests.httpapi import ApiServer, Fault


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    async with HttpClient(timeout=10) as c:
        yield c


def make_fetcher(
    client: HttpClient,
    *,
    clock: FakeClock | MonotonicTimer | None = None,
    retry: RetryPolicy | None = None,
    token: CancellationToken | None = None,
    rate: tuple[float, float] = (0.0, 0.0),
    job: str = "job1",
    **kw: object,
) -> Fetcher:
    scheduler = RequestScheduler(rate_min=rate[0], rate_max=rate[1],
                                 clock=clock or FakeClock(), rng=random.Random(1))
    return Fetcher(client, scheduler, retry or RetryPolicy.api_codes(), job_code=job,
                   token=token, logger=JobLog(job), **kw)  # type: ignore[arg-type]


def items(api: ApiServer, offset: int = 0) -> Request:
    return Request(f"{api.url}/items", params={"offset": offset, "limit": 5})


async def test_a_5xx_is_retried_with_exponential_backoff_and_jitter(
    api_server: ApiServer, client: HttpClient
) -> None:
    api_server.inject(Fault.http(503), times=2)
    clock = FakeClock()
    fetcher = make_fetcher(client, clock=clock,
                           retry=RetryPolicy(backoff_base=1.0, backoff_factor=2.0, jitter=0.5))
    response = await fetcher.fetch(items(api_server))
    assert response.status == 200
    assert len(api_server.log) == 3
    first, second = clock.sleeps
    assert 1.0 <= first <= 1.5
    assert 2.0 <= second <= 3.0
    stats = fetcher.stats["list"]
    assert (stats.ok, stats.failed, stats.attempts, stats.retries) == (1, 0, 3, 2)


async def test_a_timeout_is_retried(api_server: ApiServer, client: HttpClient) -> None:
    api_server.inject(Fault.slow(30), times=1)
    fetcher = make_fetcher(client, timeout=1.0)
    response = await fetcher.fetch(items(api_server))
    assert response.json()["total"] == 25
    assert len(api_server.log) == 2
    assert api_server.log[0].abandoned or api_server.log[0].status is None
    timeouts = [line for line in fetcher.log.lines(event="request") if line["status"] == "timeout"]
    assert len(timeouts) == 1


async def test_an_api_error_code_is_retried_then_recorded(
    api_server: ApiServer, client: HttpClient
) -> None:
    api_server.inject(Fault.api_error(500, "busy"), times=None)
    fetcher = make_fetcher(client)
    with pytest.raises(FetchError, match=r"failed after 3 tries: API error code=500: busy"):
        await fetcher.fetch(items(api_server))
    assert len(api_server.log) == 3
    stats = fetcher.stats["list"]
    assert (stats.ok, stats.failed) == (0, 1)
    assert stats.errors[0]["error"] == "API error code=500: busy"
    # the next request goes on normally once the API recovers
    api_server.clear_faults()
    assert (await fetcher.fetch(items(api_server, 5))).status == 200


async def test_a_custom_error_predicate_is_honoured(api_server: ApiServer, client: HttpClient) -> None:
    retry = RetryPolicy(tries=2, is_error=lambda r: "empty page" if not r.json()["items"] else None)
    fetcher = make_fetcher(client, retry=retry)
    with pytest.raises(FetchError, match="empty page"):
        await fetcher.fetch(items(api_server, offset=500))
    assert len(api_server.log) == 2


async def test_a_4xx_is_not_retried(api_server: ApiServer, client: HttpClient) -> None:
    fetcher = make_fetcher(client)
    with pytest.raises(FetchError, match="HTTP 404"):
        await fetcher.fetch(Request(f"{api_server.url}/items/9999"))
    assert len(api_server.log) == 1


async def test_more_consecutive_failures_than_the_limit_trip_the_run(
    api_server: ApiServer, client: HttpClient
) -> None:
    api_server.inject(Fault.http(500), times=None)
    fetcher = make_fetcher(client, retry=RetryPolicy(tries=1), max_consecutive_failures=3)
    for _ in range(3):
        with pytest.raises(FetchError) as err:
            await fetcher.fetch(items(api_server))
        assert not isinstance(err.value, TooManyFailures)
    with pytest.raises(TooManyFailures, match="4 requests failed in a row"):
        await fetcher.fetch(items(api_server))
    with pytest.raises(TooManyFailures):
        await fetcher.fetch(items(api_server))
    assert len(api_server.log) == 4  # a tripped fetcher sends nothing more


async def test_a_success_resets_the_consecutive_failure_count(
    api_server: ApiServer, client: HttpClient
) -> None:
    fetcher = make_fetcher(client, retry=RetryPolicy(tries=1), max_consecutive_failures=2)
    for _ in range(3):
        for _ in range(2):
            api_server.inject(Fault.http(500))
            with pytest.raises(FetchError):
                await fetcher.fetch(items(api_server))
        await fetcher.fetch(items(api_server))
    assert fetcher.tripped is None
    assert fetcher.stats["list"].failed == 6


async def test_every_request_is_logged_with_endpoint_status_duration_and_job(
    api_server: ApiServer, client: HttpClient
) -> None:
    api_server.inject(Fault.http(502))
    fetcher = make_fetcher(client, job="orders")
    await fetcher.fetch(items(api_server))
    lines = fetcher.log.lines(event="request")
    assert [line["status"] for line in lines] == [502, 200]
    for line in lines:
        assert line["job"] == "orders"
        assert line["endpoint"] == "GET /items"
        assert line["duration"] >= 0


async def test_cancel_abandons_the_response_wait_and_sends_nothing_after(
    api_server: ApiServer, client: HttpClient
) -> None:
    api_server.inject(Fault.slow(30), path="/items/3")
    token = CancellationToken()
    fetcher = make_fetcher(client, token=token)
    pending = asyncio.create_task(fetcher.fetch(Request(f"{api_server.url}/items/3")))
    await api_server.wait_for_requests(1)
    token.cancel("stopped by test")
    with pytest.raises(CancelledError, match="stopped by test"):
        await asyncio.wait_for(pending, 5)
    with pytest.raises(CancelledError):
        await fetcher.fetch(items(api_server))
    # the server notices the closed connection on its own schedule
    await wait_for(lambda: api_server.log[0].abandoned, "the server to see the request abandoned")
    assert len(api_server.log) == 1
    assert fetcher.stats["list"].cancelled == 1
    assert fetcher.stats["list"].failed == 0


async def test_cancel_interrupts_the_rate_limit_wait(api_server: ApiServer, client: HttpClient) -> None:
    token = CancellationToken()
    fetcher = make_fetcher(client, token=token, clock=MonotonicTimer(), rate=(60.0, 60.0))
    await fetcher.fetch(items(api_server))
    second = asyncio.create_task(fetcher.fetch(items(api_server, 5)))
    await wait_for(lambda: fetcher.scheduler.waiting, "the second request to wait its turn")
    token.cancel("stop during the gap")
    with pytest.raises(CancelledError):
        await asyncio.wait_for(second, 5)
    assert len(api_server.log) == 1


async def test_a_pre_cancelled_token_sends_nothing(api_server: ApiServer, client: HttpClient) -> None:
    token = CancellationToken()
    token.cancel("before start")
    fetcher = make_fetcher(client, token=token)
    with pytest.raises(CancelledError):
        await fetcher.fetch(items(api_server))
    assert api_server.log == []


class SlowOnTheClock:
    """A client whose every response takes ``seconds`` of the fake clock."""

    def __init__(self, client: HttpClient, clock: FakeClock, seconds: float) -> None:
        self.client, self.clock, self.seconds = client, clock, seconds

    async def request(self, req: Request, timeout: float | None = None) -> Response:
        response = await self.client.request(req, timeout)
        self.clock.advance(self.seconds)
        return response

    async def close(self) -> None:
        await self.client.close()


async def test_serial_rate_keeps_the_gap_after_each_response_not_after_each_start(
    api_server: ApiServer, client: HttpClient, clock: FakeClock
) -> None:
    # Each response takes 1 s: a gap counted from the request's start would already have
    # passed, so every sleep would be skipped.
    slow = SlowOnTheClock(client, clock, 1.0)
    fetcher = make_fetcher(slow, clock=clock, rate=(0.05, 0.1))  # type: ignore[arg-type]
    for offset in range(0, 25, 5):
        await fetcher.fetch(items(api_server, offset))
    assert [r.query["offset"] for r in api_server.log] == ["0", "5", "10", "15", "20"]
    assert len(clock.sleeps) == 4
    assert all(0.05 <= gap <= 0.1 for gap in clock.sleeps)


async def test_two_jobs_sharing_the_scheduler_keep_one_request_in_flight_in_order(
    api_server: ApiServer, client: HttpClient
) -> None:
    scheduler = RequestScheduler(rate_min=0, rate_max=0, clock=FakeClock())
    first = Fetcher(client, scheduler, job_code="first", logger=JobLog("first"))
    second = Fetcher(client, scheduler, job_code="second", logger=JobLog("second"))

    async def walk(fetcher: Fetcher, tag: str) -> None:
        for n in range(3):
            await fetcher.fetch(Request(f"{api_server.url}/echo", params={"job": tag, "n": n}))

    await asyncio.gather(walk(first, "first"), walk(second, "second"))
    assert [r.query["job"] for r in api_server.log] == ["first"] * 3 + ["second"] * 3
    assert api_server.max_in_flight == 1


async def test_the_curl_cffi_client_fetches_the_same_api(api_server: ApiServer) -> None:
    async with CurlCffiClient(timeout=10) as curl:
        scheduler = RequestScheduler(rate_min=0, rate_max=0, clock=FakeClock())
        fetcher = Fetcher(curl, scheduler, RetryPolicy.api_codes(), job_code="curl",
                          logger=JobLog("curl"))
        api_server.inject(Fault.http(503))
        response = await fetcher.fetch(items(api_server, 10))
    assert response.json()["items"][0]["id"] == 11
    assert len(api_server.log) == 2

"""The Downloader against real local servers: outcomes, redirects, size limit, timeouts,
per-job cookie sessions, idle release on a fake clock, and bans through real proxies."""

from __future__ import annotations

import asyncio
import json

import pytest

from crawlhub.agents import codes
from crawlhub.agents.codes import ResultCodes
from crawlhub.agents.downloader import Downloader, DownloaderConfig
from crawlhub.agents.proxies import ProxyPool
from crawlhub.core.errors import ConfigError
from crawlhub.fetch.http import Request
from tests.agents.servers import ForwardProxy, Site
from tests.helpers import FakeClock, wait_for
from tests.servers import free_port


def config(**kw: object) -> DownloaderConfig:
    return DownloaderConfig.from_config(kw)


async def test_a_page_is_fetched_with_its_status_body_and_the_success_code() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(f"{site.url}/page/3")
    assert got.outcome == codes.SUCCESS and got.ok
    assert got.status == 200
    assert b"<title>Page 3</title>" in got.body
    assert got.final_url == got.url == f"{site.url}/page/3"
    assert got.proxy is None and got.attempts == 1 and got.redirects == 0
    assert "text/html" in got.content_type
    assert ResultCodes().code(got.outcome, got.status) == 1000
    response = got.response()
    assert response is not None and response.status == 200 and response.body == got.body


async def test_an_http_error_status_is_the_http_error_outcome_reporting_the_status() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(f"{site.url}/status/503")
    assert got.outcome == codes.HTTP_ERROR
    assert ResultCodes().code(got.outcome, got.status) == 503


async def test_a_request_object_carries_method_params_headers_and_body() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(Request(f"{site.url}/echo", method="POST", params={"q": "1"},
                                    headers={"X-Test": "yes"}, data=b"hello"))
    echoed = json.loads(got.body)
    assert echoed["method"] == "POST" and echoed["query"] == {"q": "1"}
    assert echoed["headers"]["x-test"] == "yes" and echoed["body"] == "hello"
    assert echoed["headers"]["user-agent"].startswith("crawlhub/")


async def test_redirects_are_followed_to_the_final_url_and_counted() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(f"{site.url}/redirect/3")
    assert got.outcome == codes.SUCCESS
    assert got.final_url == f"{site.url}/page/0"
    assert got.redirects == 4
    assert d.stats()["downloader/redirects"] == 4


async def test_a_redirect_loop_ends_as_too_many_redirects_after_the_limit() -> None:
    async with Site() as site, Downloader(config(max_redirects=5)) as d:
        got = await d.fetch(f"{site.url}/loop")
    assert got.outcome == codes.TOO_MANY_REDIRECTS
    assert ResultCodes().code(got.outcome, got.status) == 2006
    assert site.hits["/loop"] == 6  # the first request and 5 redirects followed, no more
    assert "5 redirects" in got.error


async def test_a_303_after_a_post_is_followed_with_a_get_without_the_body() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(Request(f"{site.url}/post-redirect", method="POST", data=b"x"))
    echoed = json.loads(got.body)
    assert echoed["method"] == "GET" and echoed["body"] == ""


async def test_a_body_announced_larger_than_max_size_is_not_read() -> None:
    async with Site(huge_size=5_000_000) as site, Downloader(config(max_size=1_000_000)) as d:
        got = await d.fetch(f"{site.url}/huge-length")
    assert got.outcome == codes.TOO_LARGE and got.body == b""
    assert ResultCodes().code(got.outcome, got.status) == 2004


async def test_a_streamed_body_is_cut_off_past_max_size_and_the_server_stops_sending() -> None:
    huge = 500 * 1024 * 1024
    async with Site(huge_size=huge) as site, Downloader(config(max_size=1_000_000)) as d:
        got = await d.fetch(f"{site.url}/huge-stream")
        assert got.outcome == codes.TOO_LARGE and got.body == b""
        await wait_for(site.stream_done.is_set, "the server to see the client go away")
    assert site.streamed < huge // 10


async def test_a_compressed_body_is_limited_by_its_decompressed_size() -> None:
    async with Site(huge_size=20_000_000) as site, Downloader(config(max_size=1_000_000)) as d:
        got = await d.fetch(f"{site.url}/gzip-bomb")
    assert got.outcome == codes.TOO_LARGE


async def test_a_page_slower_than_the_timeout_is_the_timeout_outcome() -> None:
    async with Site() as site, Downloader(config(timeout=0.3)) as d:
        got = await d.fetch(f"{site.url}/slow")
    assert got.outcome == codes.TIMEOUT and got.status == 0
    assert ResultCodes().code(got.outcome) == 2001


async def test_a_refused_connection_is_the_connection_error_outcome() -> None:
    async with Downloader() as d:
        got = await d.fetch(f"http://127.0.0.1:{free_port()}/")
    assert got.outcome == codes.CONNECTION_ERROR and got.status == 0
    assert "connect" in got.error.lower()
    assert ResultCodes().code(got.outcome) == 2002


async def test_cookies_are_kept_per_job_and_never_shared_across_jobs() -> None:
    async with Site() as site, Downloader() as d:
        await d.fetch(f"{site.url}/set-cookie?sid=alpha", job="a")
        seen_by_a = json.loads((await d.fetch(f"{site.url}/cookies", job="a")).body)
        seen_by_b = json.loads((await d.fetch(f"{site.url}/cookies", job="b")).body)
        await d.fetch(f"{site.url}/set-cookie?sid=beta", job="b")
        again_a = json.loads((await d.fetch(f"{site.url}/cookies", job="a")).body)
        again_b = json.loads((await d.fetch(f"{site.url}/cookies", job="b")).body)
        assert d.cookies("a") == {"sid": "alpha"}
    assert seen_by_a == {"sid": "alpha"}
    assert seen_by_b == {}
    assert again_a == {"sid": "alpha"} and again_b == {"sid": "beta"}


async def test_an_idle_session_is_released_and_its_cookies_forgotten(clock: FakeClock) -> None:
    async with Site() as site, Downloader(config(session_idle=60), clock=clock) as d:
        await d.fetch(f"{site.url}/set-cookie?sid=alpha", job="a")
        clock.advance(59)
        await d.fetch(f"{site.url}/page/1", job="b")
        assert sorted(d.sessions) == ["a", "b"]
        clock.advance(2)  # a idle for 61 s, b for 2 s: the next fetch sweeps a away
        await d.fetch(f"{site.url}/page/2", job="b")
        assert d.sessions == ["b"]
        fresh = json.loads((await d.fetch(f"{site.url}/cookies", job="a")).body)
        assert d.stats()["downloader/sessions/released"] == 1
    assert fresh == {}


async def test_a_session_with_a_request_in_flight_is_not_released(clock: FakeClock) -> None:
    async with Site() as site, Downloader(config(session_idle=60), clock=clock) as d:
        pending = asyncio.create_task(d.fetch(f"{site.url}/held", job="a"))
        await wait_for(lambda: site.held == 1, "the request to reach the server")
        clock.advance(3600)
        assert await d.release_idle() == 0
        assert d.sessions == ["a"]
        site.release.set()
        assert (await pending).body == b"released"
        clock.advance(61)
        assert await d.release_idle() == 1
        assert d.sessions == []


async def test_requests_through_a_proxy_reach_the_site() -> None:
    async with Site() as site, ForwardProxy() as proxy:
        async with Downloader(proxies=ProxyPool([proxy.url])) as d:
            await d.fetch(f"{site.url}/set-cookie?sid=p", job="j")
            got = await d.fetch(f"{site.url}/cookies", job="j")
    assert got.outcome == codes.SUCCESS and got.proxy == proxy.url
    assert json.loads(got.body) == {"sid": "p"}
    assert proxy.seen == [f"{site.url}/set-cookie?sid=p", f"{site.url}/cookies"]


async def test_a_proxy_banned_by_status_is_retired_and_the_page_fetched_through_another(
    clock: FakeClock,
) -> None:
    async with Site() as site, ForwardProxy(ban_status=403) as bad, ForwardProxy() as good:
        pool = ProxyPool([bad.url, good.url], cooldown=600, clock=clock)
        cfg = config(ban={"statuses": [403]})
        async with Downloader(cfg, proxies=pool, clock=clock) as d:
            got = await d.fetch(f"{site.url}/page/4")
            assert pool.is_retired(bad.url) and not pool.is_retired(good.url)
            again = await d.fetch(f"{site.url}/page/5")  # the retired proxy is skipped
            stats = d.stats()
    assert got.outcome == codes.SUCCESS and got.proxy == good.url and got.attempts == 2
    assert b"Page 4" in got.body
    assert again.proxy == good.url and again.attempts == 1
    assert len(bad.seen) == 1 and len(good.seen) == 2
    assert stats["downloader/bans"] == 1 and stats["downloader/ban_retries"] == 1
    assert stats[f"proxies/retirements/{bad.url}"] == 1


async def test_a_proxy_banned_by_body_text_is_retired_and_the_page_fetched_through_another(
    clock: FakeClock,
) -> None:
    async with (
        Site() as site,
        ForwardProxy(ban_body="<h1>Access denied: you look like a robot</h1>") as bad,
        ForwardProxy() as good,
    ):
        pool = ProxyPool([bad.url, good.url], clock=clock)
        cfg = config(ban={"body_regex": r"Access denied.*robot"})
        async with Downloader(cfg, proxies=pool, clock=clock) as d:
            got = await d.fetch(f"{site.url}/page/6")
    assert got.outcome == codes.SUCCESS and got.proxy == good.url
    assert pool.is_retired(bad.url)


async def test_a_ban_clears_the_jobs_cookies(clock: FakeClock) -> None:
    async with Site() as site, ForwardProxy() as first, ForwardProxy() as second:
        pool = ProxyPool([first.url, second.url], clock=clock)
        async with Downloader(config(ban={"statuses": [403]}), proxies=pool, clock=clock) as d:
            await d.fetch(f"{site.url}/set-cookie?sid=known", job="j")
            assert d.cookies("j") == {"sid": "known"}
            first.ban_status = second.ban_status = 403
            got = await d.fetch(f"{site.url}/page/1", job="j")
            assert d.cookies("j") == {}
    assert got.outcome == codes.BANNED


async def test_when_every_proxy_is_banned_the_outcome_is_banned_after_bounded_retries(
    clock: FakeClock,
) -> None:
    async with Site() as site:
        proxies = [ForwardProxy(ban_status=429) for _ in range(4)]
        for p in proxies:
            await p.start()
        try:
            pool = ProxyPool([p.url for p in proxies], clock=clock)
            cfg = config(ban={"statuses": [429], "retries": 2})
            async with Downloader(cfg, proxies=pool, clock=clock) as d:
                got = await d.fetch(f"{site.url}/page/1")
                assert got.outcome == codes.BANNED and got.status == 429
                assert got.attempts == 3
                assert sum(len(p.seen) for p in proxies) == 3
                assert ResultCodes().code(got.outcome, got.status) == 2003
                # the fourth proxy goes too; then nothing is left to try
                await d.fetch(f"{site.url}/page/2")
                none_left = await d.fetch(f"{site.url}/page/3")
        finally:
            for p in proxies:
                await p.stop()
    assert none_left.outcome == codes.BANNED and none_left.status == 0
    assert "no proxy available" in none_left.error
    assert site.hits["/page/1"] == 0


async def test_a_dead_proxy_is_retired_and_the_request_tried_on_another(clock: FakeClock) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with Site() as site, ForwardProxy() as good:
        pool = ProxyPool([dead, good.url], clock=clock)
        async with Downloader(proxies=pool, clock=clock) as d:
            got = await d.fetch(f"{site.url}/page/1")
    assert got.outcome == codes.SUCCESS and got.proxy == good.url and got.attempts == 2
    assert pool.is_retired(dead)


async def test_proxies_from_a_provider_url_are_used(clock: FakeClock) -> None:
    async with Site() as site, ForwardProxy() as proxy:
        site.proxy_list = f"# from the provider\n{proxy.url}\n"
        cfg = config(proxies={"provider_url": f"{site.url}/proxies.txt"})
        async with Downloader(cfg, clock=clock) as d:
            got = await d.fetch(f"{site.url}/page/1")
    assert got.proxy == proxy.url and got.outcome == codes.SUCCESS
    assert proxy.seen == [f"{site.url}/page/1"]


def test_bad_downloader_config_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        DownloaderConfig.from_config({"ban": {"body_regex": "(unclosed"}}, file="agent.yaml")
    assert err.value.key == "downloader.ban.body_regex"
    assert "regular expression" in str(err.value) and "agent.yaml" in str(err.value)
    with pytest.raises(ConfigError) as err:
        DownloaderConfig.from_config({"max_sise": 10})
    assert err.value.key == "downloader.max_sise"
    with pytest.raises(ConfigError) as err:
        DownloaderConfig.from_config({"ban": {"statuses": [1000]}})
    assert err.value.key == "downloader.ban.statuses"
    with pytest.raises(ConfigError) as err:
        DownloaderConfig.from_config({"proxies": {"urls": ["nonsense"]}})
    assert err.value.key == "downloader.proxies.urls"
    with pytest.raises(ConfigError) as err:
        DownloaderConfig.from_config({"timeout": 0})
    assert err.value.key == "downloader.timeout"


async def test_without_proxies_a_ban_retires_the_session_and_retries_with_fresh_cookies() -> None:
    async with Site() as site, Downloader(config(ban={"statuses": [403]})) as d:
        await d.fetch(f"{site.url}/set-cookie?sid=tracked", job="j")
        got = await d.fetch(f"{site.url}/guarded", job="j")
    assert got.outcome == codes.SUCCESS and got.attempts == 2
    assert got.body == b"welcome, stranger"
    assert site.hits["/guarded"] == 2


async def test_with_no_ban_retries_a_banned_response_is_reported_at_once() -> None:
    async with Site() as site, Downloader(config(ban={"statuses": [403], "retries": 0})) as d:
        await d.fetch(f"{site.url}/set-cookie?sid=tracked", job="j")
        got = await d.fetch(f"{site.url}/guarded", job="j")
    assert got.outcome == codes.BANNED and got.status == 403 and got.attempts == 1
    assert site.hits["/guarded"] == 1


async def test_a_closed_downloader_refuses_new_requests_plainly() -> None:
    d = Downloader()
    await d.close()
    with pytest.raises(RuntimeError, match="closed"):
        await d.fetch("http://127.0.0.1:1/")


async def test_concurrent_first_requests_wait_for_the_one_provider_read(clock: FakeClock) -> None:
    async with Site() as site, ForwardProxy() as proxy:
        site.proxy_list = proxy.url
        cfg = config(proxies={"provider_url": f"{site.url}/proxies.txt"})
        async with Downloader(cfg, clock=clock) as d:
            got = await asyncio.gather(*(d.fetch(f"{site.url}/page/{i}") for i in range(20)))
    assert [g.outcome for g in got] == [codes.SUCCESS] * 20
    assert {g.proxy for g in got} == {proxy.url}
    assert site.hits["/proxies.txt"] == 1


async def test_cookies_set_on_a_redirect_are_kept_for_the_next_hop() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(f"{site.url}/login", job="j")
    assert got.final_url == f"{site.url}/cookies" and json.loads(got.body) == {"sid": "logged"}


async def test_credentials_are_not_sent_on_to_another_origin_after_a_redirect() -> None:
    async with Site() as site, Site() as other, Downloader() as d:
        secret = {"Authorization": "Bearer s3cret", "X-Keep": "1"}
        same = await d.fetch(Request(f"{site.url}/to?url=/echo", headers=secret))
        away = await d.fetch(Request(f"{site.url}/to?url={other.url}/echo", headers=secret))
    assert json.loads(same.body)["headers"]["authorization"] == "Bearer s3cret"
    sent_away = json.loads(away.body)["headers"]
    assert "authorization" not in sent_away and sent_away["x-keep"] == "1"


async def test_a_307_redirect_keeps_the_method_and_body() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(Request(f"{site.url}/to?url=/echo&status=307", method="POST",
                                    data=b"payload"))
    echoed = json.loads(got.body)
    assert echoed["method"] == "POST" and echoed["body"] == "payload"


@pytest.mark.parametrize(
    "url", ["", "not a url", "ftp://x/", "http://[bad", "http://h:99999/", "http:///nohost"]
)
async def test_a_url_that_cannot_be_requested_is_the_invalid_url_outcome(url: str) -> None:
    async with Downloader() as d:
        got = await d.fetch(url)
    assert got.outcome == codes.INVALID_URL and got.status == 0
    assert ResultCodes().code(got.outcome) == 2008


async def test_a_redirect_to_an_invalid_url_is_the_invalid_url_outcome() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(f"{site.url}/to?url=http://h:99999/x")
    assert got.outcome == codes.INVALID_URL


async def test_response_headers_such_as_retry_after_reach_the_caller() -> None:
    async with Site() as site, Downloader() as d:
        got = await d.fetch(f"{site.url}/retry-after/7")
    assert got.outcome == codes.HTTP_ERROR and got.status == 429
    assert got.headers["retry-after"] == "7"

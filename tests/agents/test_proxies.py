"""ProxyPool: rotation, retirement with cooldown on a fake clock, provider refresh, stats."""

from __future__ import annotations

import aiohttp
import pytest

from crawlhub.agents.proxies import ProxyConfig, ProxyPool
from crawlhub.core.errors import ConfigError
from tests.agents.servers import Site
from tests.helpers import FakeClock

A, B, C = "http://10.0.0.1:3128", "http://10.0.0.2:3128", "http://10.0.0.3:3128"


def test_proxies_rotate_round_robin() -> None:
    pool = ProxyPool([A, B, C])
    assert [pool.pick() for _ in range(6)] == [A, B, C, A, B, C]


def test_an_empty_pool_is_not_configured_and_picks_nothing() -> None:
    pool = ProxyPool()
    assert not pool.configured and pool.pick() is None


def test_a_retired_proxy_sits_out_its_cooldown_then_comes_back(clock: FakeClock) -> None:
    pool = ProxyPool([A, B], cooldown=300, clock=clock)
    pool.retire(A)
    assert [pool.pick() for _ in range(3)] == [B, B, B]
    assert pool.available() == [B]
    clock.advance(299)
    assert pool.is_retired(A)
    clock.advance(1)
    assert not pool.is_retired(A)
    assert {pool.pick(), pool.pick()} == {A, B}


def test_a_retirement_may_name_its_own_cooldown(clock: FakeClock) -> None:
    pool = ProxyPool([A], cooldown=300, clock=clock)
    pool.retire(A, cooldown=5)
    assert pool.pick() is None
    clock.advance(5)
    assert pool.pick() == A


def test_pick_skips_excluded_proxies_and_answers_none_when_all_are_out(clock: FakeClock) -> None:
    pool = ProxyPool([A, B], clock=clock)
    assert pool.pick(exclude={A}) == B
    assert pool.pick(exclude={A, B}) is None
    pool.retire(A)
    pool.retire(B)
    assert pool.pick() is None and pool.configured


def test_stats_count_picks_and_retirements_with_credentials_masked(clock: FakeClock) -> None:
    secret = "http://user:hunter2@10.0.0.9:8080"
    pool = ProxyPool([secret, A], clock=clock)
    pool.pick()
    pool.retire(secret)
    stats = pool.stats()
    assert stats["proxies/known"] == 2 and stats["proxies/available"] == 1
    assert stats["proxies/retired"] == 1
    assert stats["proxies/picks/http://user:***@10.0.0.9:8080"] == 1
    assert stats["proxies/retirements/http://user:***@10.0.0.9:8080"] == 1
    assert "hunter2" not in repr(stats)


async def test_the_provider_list_is_read_and_refreshed_after_refresh_every(
    clock: FakeClock,
) -> None:
    async with Site() as site, aiohttp.ClientSession() as http:
        site.proxy_list = f"# comment\n\n{A}\n10.0.0.2:3128\nnot a proxy at all\n"
        pool = ProxyPool(provider_url=f"{site.url}/proxies.txt", refresh_every=60, clock=clock)
        assert pool.configured and pool.due_refresh()
        await pool.maybe_refresh(http)
        assert pool.proxies == [A, B]
        assert pool.refresh_errors == 1  # the line that is not a proxy
        site.proxy_list = C
        await pool.maybe_refresh(http)  # not due yet
        assert pool.proxies == [A, B]
        clock.advance(60)
        await pool.maybe_refresh(http)
        assert pool.proxies == [C]
    assert site.hits["/proxies.txt"] == 2


async def test_a_failing_provider_keeps_the_old_list(clock: FakeClock) -> None:
    async with Site() as site, aiohttp.ClientSession() as http:
        site.proxy_list = A
        pool = ProxyPool([B], provider_url=f"{site.url}/proxies.txt", clock=clock)
        await pool.refresh(http)
        assert pool.proxies == [B, A]
        site.proxy_list_status = 500
        await pool.refresh(http)
        assert pool.proxies == [B, A]
        assert "HTTP 500" in pool.last_refresh_error


async def test_a_refresh_keeps_retirements_of_proxies_still_listed(clock: FakeClock) -> None:
    async with Site() as site, aiohttp.ClientSession() as http:
        site.proxy_list = f"{A}\n{B}"
        pool = ProxyPool(provider_url=f"{site.url}/proxies.txt", clock=clock)
        await pool.refresh(http)
        pool.retire(A)
        await pool.refresh(http)
        assert pool.is_retired(A) and pool.available() == [B]


def test_config_accepts_a_bare_list_and_names_the_key_of_a_bad_entry() -> None:
    assert ProxyConfig.from_config([A, B]).urls == [A, B]
    with pytest.raises(ConfigError) as err:
        ProxyConfig.from_config({"urls": [A, "ftp://x"]}, file="agent.yaml")
    assert err.value.key == "proxies.urls"
    with pytest.raises(ConfigError) as err:
        ProxyConfig.from_config({"provider_url": "file:///etc/passwd"})
    assert err.value.key == "proxies.provider_url"
    with pytest.raises(ConfigError) as err:
        ProxyConfig.from_config({"cooldown": -1})
    assert err.value.key == "proxies.cooldown"
    with pytest.raises(ConfigError) as err:
        ProxyConfig.from_config({"list": [A]})
    assert err.value.key == "proxies.list"


@pytest.mark.parametrize(
    "bad", ["http://", "socks5://10.0.0.1:1080", "http://h:1/path", "http://a b:1", "10.0.0.1"]
)
def test_a_value_that_is_not_an_http_proxy_url_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="not a proxy URL") as err:
        ProxyConfig.from_config({"urls": [bad]})
    assert err.value.key == "proxies.urls"

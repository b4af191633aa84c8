"""``Backend.parse``: every accepted scheme names its backend; bad URLs name themselves
(password masked), what they were for and the accepted schemes."""

from __future__ import annotations

import pytest

from crawlhub.backends.backend import Backend, BackendURLError, accepted_schemes
from crawlhub.core.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "kind", "dsn", "path"),
    [
        ("sqlite:///data/q.db", "sqlite", "sqlite:///data/q.db", "data/q.db"),
        ("sqlite:////var/lib/crawlhub/q.db", "sqlite", "sqlite:////var/lib/crawlhub/q.db",
         "/var/lib/crawlhub/q.db"),
        ("sqlite+aiosqlite:///meta.db", "sqlite", "sqlite+aiosqlite:///meta.db", "meta.db"),
        ("sqlite:///:memory:", "sqlite", "sqlite:///:memory:", ":memory:"),
        ("sqlite://", "sqlite", "sqlite://", ":memory:"),
        ("sqlite:///q.db?mode=rwc", "sqlite", "sqlite:///q.db?mode=rwc", "q.db"),
        ("redis://127.0.0.1:6379/0", "redis", "redis://127.0.0.1:6379/0", ""),
        ("rediss://:pw@cache.example:6380/2", "redis", "rediss://:pw@cache.example:6380/2", ""),
        ("valkey://127.0.0.1:6379/1", "redis", "redis://127.0.0.1:6379/1", ""),
        ("valkeys://u:pw@cache.example/0", "redis", "rediss://u:pw@cache.example/0", ""),
        ("unix:///run/redis.sock?db=3", "redis", "unix:///run/redis.sock?db=3", ""),
        ("postgresql://u:pw@db:5432/crawl", "postgres", "postgresql://u:pw@db:5432/crawl", ""),
        ("postgres://db/crawl", "postgres", "postgresql://db/crawl", ""),
        ("postgresql+asyncpg://db/crawl", "postgres", "postgresql://db/crawl", ""),
        ("kafka://k1:9092,k2:9092", "kafka", "k1:9092,k2:9092", ""),
    ],
)
def test_every_accepted_scheme_names_its_backend_and_client_url(
    url: str, kind: str, dsn: str, path: str
) -> None:
    parsed = Backend.parse(url)
    assert (parsed.kind, parsed.dsn, parsed.path) == (kind, dsn, path)
    assert parsed.url == url


def test_scheme_case_does_not_matter() -> None:
    assert Backend.parse("REDIS://h:6379/0").kind == "redis"


def test_every_documented_scheme_is_accepted() -> None:
    assert accepted_schemes() == [
        "sqlite://", "sqlite+aiosqlite://", "redis://", "rediss://", "valkey://", "valkeys://",
        "unix://", "postgresql://", "postgres://", "postgresql+asyncpg://",
        "postgresql+psycopg://", "postgres+asyncpg://", "kafka://",
    ]


@pytest.mark.parametrize("url", ["amqp://u:s3cret@mq/", "mysql://root:s3cret@db/x", "queues.db",
                                 "", "redis:/h"])
def test_unknown_scheme_names_the_url_without_password_and_the_accepted_schemes(url: str) -> None:
    with pytest.raises(BackendURLError) as e:
        Backend.parse(url, what="queue backend", key="storage.queues")
    text = str(e.value)
    assert "s3cret" not in text
    assert "queue backend URL" in text
    assert "accepted: sqlite://, sqlite+aiosqlite://, redis://" in text
    assert e.value.key == "storage.queues"
    assert isinstance(e.value, ConfigError)


def test_a_backend_the_caller_cannot_open_is_refused_with_only_its_schemes() -> None:
    with pytest.raises(BackendURLError) as e:
        Backend.parse("postgresql://u:s3cret@db/x", kinds=("sqlite", "redis"),
                          what="hub state")
    text = str(e.value)
    assert "'postgresql://u:***@db/x'" in text
    assert "accepted: sqlite://, sqlite+aiosqlite://, redis://, rediss://, valkey://, " \
           "valkeys://, unix:// " in text
    assert "postgres://" not in text.split("accepted:")[1]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("sqlite:///", "no file path"),
        ("sqlite://host/q.db", "a host is not allowed"),
        ("redis://:s3cret@h:port/0", "the port is not a number"),
        ("redis://:s3cret@h:99999/0", "port out of range"),
        ("redis:///0", "no host"),
        ("valkey://h/zero", "database 'zero' is not a number"),
        ("unix://", "no socket path"),
        ("kafka://", "no host:port"),
        ("kafka://a:1,,b:2", "no host:port"),
    ],
)
def test_malformed_urls_say_what_is_wrong_and_show_the_right_form(url: str, reason: str) -> None:
    with pytest.raises(BackendURLError, match="is malformed") as e:
        Backend.parse(url)
    assert reason in str(e.value)
    assert "s3cret" not in str(e.value)
    assert "use " in str(e.value)


def test_redacted_masks_the_password_only() -> None:
    assert Backend.parse("redis://u:s3cret@h:6379/0").redacted == "redis://u:***@h:6379/0"
    assert Backend.parse("redis://h:6379/0").redacted == "redis://h:6379/0"


@pytest.mark.parametrize("scheme", ["redis", "valkey", "valkeys", "rediss"])
async def test_every_factory_accepts_every_redis_scheme(scheme: str) -> None:
    from scrapy.settings import Settings

    from crawlhub.contrib.scrapy.settings import read_settings
    from crawlhub.frontier.open import open_store
    from crawlhub.frontier.redis import RedisSeedStore
    from crawlhub.hub.state import RedisHubState, open_state
    from crawlhub.queues import open_backend
    from crawlhub.queues.redis import RedisQueueBackend

    url = f"{scheme}://127.0.0.1:6379/0"
    queues = open_backend(url)
    state = open_state(url)
    frontier = open_store(url, "f", prefix="t:", expected_items=1000, fp_rate=0.01)
    try:
        assert isinstance(queues, RedisQueueBackend)
        assert isinstance(state, RedisHubState)
        assert isinstance(frontier, RedisSeedStore)
        # the Scrapy scheduler's CRAWLHUB_URL: shared storage, records dropped when done
        crawl = read_settings(Settings({"CRAWLHUB_URL": url}), "spider")
        assert (crawl.frontier_url, crawl.queues_url, crawl.frontier.archive) == (url, url,
                                                                                 False)
    finally:
        await queues.close()
        await state.close()
        await frontier.close()


@pytest.mark.parametrize(
    ("factory", "key"),
    [("queues", "storage.queues"), ("state", "storage.state"), ("frontier", "storage.frontier"),
     ("metadata", "storage.metadata")],
)
def test_every_factory_refuses_an_unknown_scheme_with_its_config_key(factory: str, key: str
                                                                     ) -> None:
    from crawlhub.collect.store import store_for
    from crawlhub.frontier.open import open_store
    from crawlhub.hub.state import open_state
    from crawlhub.queues import open_backend

    url = "amqp://u:s3cret@mq/"
    opener = {
        "queues": lambda: open_backend(url),
        "state": lambda: open_state(url),
        "frontier": lambda: open_store(url, "f", prefix="t:", expected_items=10, fp_rate=0.01),
        "metadata": lambda: store_for(url),
    }[factory]
    with pytest.raises(BackendURLError) as e:
        opener()
    assert e.value.key == key
    assert "s3cret" not in str(e.value)


async def test_the_postgres_sink_refuses_a_url_that_is_not_postgres_naming_the_sink() -> None:
    from crawlhub.sinks.config import PostgresSinkConfig
    from crawlhub.sinks.postgres import PostgresSink

    sink = PostgresSink(PostgresSinkConfig(url="mysql://u:s3cret@db/x", table="t"), name="pg")
    with pytest.raises(BackendURLError, match="sink 'pg' URL 'mysql://u:\\*\\*\\*@db/x'"):
        await sink.open()

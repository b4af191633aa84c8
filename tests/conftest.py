"""Shared fixtures: real Redis, PostgreSQL and Kafka-protocol servers (never fakes)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests import servers
from tests.helpers import FakeClock


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with servers.redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with servers.postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with servers.tansu_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
def unique_name() -> str:
    """A name no other test uses: key prefixes, queue names, table names."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def clock() -> FakeClock:
    """The suite's fake clock (tests.helpers.FakeClock): time moves only when told."""
    return FakeClock()

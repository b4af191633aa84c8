"""The backend error table: which client errors mean "out of reach", and for which
client libraries a config's 503 answers are registered."""

from __future__ import annotations

import sqlite3

import asyncpg
import redis.exceptions

from crawlhub.backends.errors import clients_of, is_unavailable, unavailable_types
from crawlhub.config import CrawlhubConfig
from crawlhub.core.errors import BackendUnavailable, CrawlhubError


def test_the_clients_a_config_needs_are_read_from_its_urls_anywhere_in_it() -> None:
    assert clients_of(CrawlhubConfig()) == set()  # the embedded default: SQLite only
    cfg = CrawlhubConfig.model_validate({
        "storage": {"queues": "redis://127.0.0.1:6379/0"},
    })
    assert clients_of(cfg) == {"redis"}
    # plain data too, nested as deep as it goes, schemes in any case
    assert clients_of({"sinks": [{"url": "PostgreSQL://u@h/db"}], "x": ("rediss://h",)}) \
        == {"asyncpg", "redis"}
    assert clients_of({"a": "not a url", "b": "http://127.0.0.1/"}) == set()
    # every scheme the backends take (backends.backend.SCHEMES), driver suffixes too
    assert clients_of(["postgresql+asyncpg://h/db", "valkeys://h", "unix:///r.sock"]) \
        == {"asyncpg", "redis"}


def test_a_loaded_clients_types_are_registered_even_when_no_config_names_it() -> None:
    # (both libraries are imported by this module, so both are "loaded" here: the
    # types of a loaded library are always among them, named or not)
    named_none = unavailable_types(set())
    assert redis.exceptions.ConnectionError in named_none
    assert asyncpg.exceptions.CannotConnectNowError in named_none
    assert sqlite3.OperationalError in named_none
    assert ConnectionError in named_none and TimeoutError in named_none


def test_an_outage_of_each_client_is_unavailable_and_other_errors_are_not() -> None:
    assert is_unavailable(redis.exceptions.ConnectionError("refused"))
    assert is_unavailable(asyncpg.exceptions.CannotConnectNowError("starting up"))
    assert is_unavailable(sqlite3.OperationalError("unable to open database file"))
    assert not is_unavailable(sqlite3.OperationalError("no such table: x"))
    assert not is_unavailable(redis.exceptions.ResponseError("WRONGTYPE"))
    assert not is_unavailable(ValueError("x"))
    wrapped = CrawlhubError("push failed")
    wrapped.__cause__ = redis.exceptions.TimeoutError("slow")
    assert is_unavailable(wrapped)
    assert is_unavailable(BackendUnavailable("down", backend="redis", retry_after=1.0))

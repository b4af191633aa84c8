"""``Backend``: a URL parsed once and handed down; a factory is a table of the kinds a
component can open, and the refusals read the same for every component."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import crawlhub.backends.backend as backend_module
from crawlhub.agents.registry import open_registry
from crawlhub.backends.backend import Backend, BackendURLError
from crawlhub.core.errors import MissingExtraError
from crawlhub.hub.state import open_state
from crawlhub.queues import BACKENDS, open_backend


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs parsed from now on."""
    seen: list[str] = []
    parse = backend_module._parse

    def counted(url: str, *args: Any) -> Backend:
        seen.append(url)
        return parse(url, *args)

    monkeypatch.setattr(backend_module, "_parse", counted)
    return seen


def test_a_backend_knows_its_kind_client_url_redacted_url_and_purpose() -> None:
    backend = Backend.parse("valkey://:s3cret@cache:6379/1", what="hub state",
                            key="storage.state")
    assert (backend.kind, backend.dsn, backend.what, backend.key) == (
        "redis", "redis://:s3cret@cache:6379/1", "hub state", "storage.state")
    assert str(backend) == "valkey://:s3cret@cache:6379/1"
    assert "s3cret" not in backend.redacted and "s3cret" not in repr(backend)


def test_a_parsed_backend_is_not_parsed_again(parses: list[str]) -> None:
    backend = Backend.parse("sqlite:///q.db", kinds=("sqlite", "redis"))
    assert Backend.parse(backend, kinds=("sqlite",), what="SQLite queue") is backend
    assert parses == ["sqlite:///q.db"]


async def test_each_factory_parses_its_url_once(parses: list[str], tmp_path: Path,
                                                redis_url: str) -> None:
    queues = open_backend(f"sqlite:///{tmp_path}/q.db")
    await queues.close()
    state = open_state(redis_url, prefix="test:backend:")
    await state.close()
    registry = open_registry(f"sqlite:///{tmp_path}/agents.db")
    await registry.close()
    assert parses == [f"sqlite:///{tmp_path}/q.db", redis_url, f"sqlite:///{tmp_path}/agents.db"]


def test_a_url_no_component_kind_matches_is_refused_naming_what_and_key() -> None:
    with pytest.raises(BackendURLError) as caught:
        open_backend("postgresql://u:s3cret@db/crawl")
    text = str(caught.value)
    assert "queue backend URL 'postgresql://u:***@db/crawl' has no scheme crawlhub can open" \
        in text
    assert "accepted: sqlite://, sqlite+aiosqlite://, redis://" in text
    assert "postgresql://" not in text.split("accepted:")[1]
    assert caught.value.key == "storage.queues"


def test_open_refuses_a_kind_the_component_has_no_implementation_for() -> None:
    backend = Backend.parse("postgresql://db/crawl", what="queue backend", key="storage.queues")
    with pytest.raises(BackendURLError, match="queue backend URL 'postgresql://db/crawl' has no"
                       " scheme crawlhub can open; accepted: sqlite://") as caught:
        backend.open(BACKENDS)
    assert caught.value.key == "storage.queues"


def test_open_hands_the_backend_and_the_arguments_of_its_kind_only() -> None:
    def impl(backend: Backend, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return backend, args, kwargs

    backend = Backend.parse("sqlite:///x.db")
    assert backend.open({"sqlite": impl, "redis": "no.such.module:Nothing"}, 1, a=2,
                        sqlite={"b": 3}, redis={"c": 4}) == (backend, (1,), {"a": 2, "b": 3})


def test_open_imports_an_implementation_named_by_its_path_when_chosen() -> None:
    backend = Backend.parse("redis://:s3cret@h:6379/0")
    shown = backend.open({"redis": "builtins:repr", "sqlite": "no.such.module:Nothing"})
    assert shown == repr(backend) and "s3cret" not in shown


def test_the_client_library_is_required_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    backend = Backend.parse("redis://h:6379/0", what="agent registry")
    with pytest.raises(MissingExtraError, match=r"^agent registry needs the Python package "
                       r"'redis', which is not installed: pip install 'crawlhub\[redis\]'$"):
        backend.open({"redis": "builtins:repr"})
    with pytest.raises(MissingExtraError, match=r"^the Redis queue backend \(storage.queues\)"
                       " needs the Python package 'redis'"):
        open_backend("redis://h:6379/0")
    assert Backend.parse("sqlite:///x.db").require().__name__ == "sqlite3"

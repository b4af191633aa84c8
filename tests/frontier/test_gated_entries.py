"""The hub's frontier gate resolved in two steps: the (segment, key) of a task without
I/O (the hub records it before admitting), then the admission of exactly that entry."""

from __future__ import annotations

import pytest

from crawlhub.core.errors import FrontierError
from tests.frontier.conftest import MakeFrontier


async def test_task_entries_resolve_keys_without_admitting(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    now = f.clock()
    a, none, b = f.task_entries([{"url": "http://A.com/p?b=2&a=1#x", "task_uuid": "u1"},
                                 {"task_src": 1}, {"url": "http://a.com/p?a=1&b=2"}], now)
    assert none is None and a is not None and b is not None
    assert (a.key, a.segment) == (b.key, b.segment) and a.dispatched
    assert (await f.stats()) == []  # nothing stored yet


async def test_admit_entries_admits_once_and_records_them_dispatched(
        make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    entries = f.task_entries([{"url": "http://a.com/1"}, {"url": "http://a.com/1#again"},
                              {"url": "http://a.com/2"}], f.clock())
    assert await f.admit_entries([e for e in entries if e]) == [True, False, True]
    [row] = await f.stats()
    assert (row["admitted"], row["dispatched"], row["pending"]) == (2, 2, 0)
    assert await f.lease(5, 60) == []


async def test_gated_entry_rebuilds_the_entry_a_task_was_gated_with(
        make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    task = {"url": "http://a.com/1", "task_uuid": "u"}
    [entry] = f.task_entries([task], f.clock())
    assert entry is not None
    again = f.gated_entry(task, entry.segment, entry.key)
    assert again is not None and (again.key, again.segment, again.hash) == (
        entry.key, entry.segment, entry.hash)
    assert await f.admit_entries([entry]) == [True]
    assert await f.admit_entries([again]) == [False]


async def test_an_unusable_url_fails_task_entries(make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    with pytest.raises(FrontierError):
        f.task_entries([{"url": "http://[::1"}], f.clock())


async def test_admitted_by_names_the_task_a_url_was_admitted_for(
        make_frontier: MakeFrontier) -> None:
    f = await make_frontier()
    [first, second] = f.task_entries([{"url": "http://a.com/1", "task_uuid": "u1"},
                                      {"url": "http://a.com/1", "task_uuid": "u2"}], f.clock())
    assert first is not None and second is not None
    assert await f.admitted_by(first) is None
    assert await f.admit_entries([first]) == [True]
    assert await f.admit_entries([second]) == [False]
    assert await f.admitted_by(second) == "u1"

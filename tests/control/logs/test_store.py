"""The log store conformance suite: every backend (SQLite FTS5, PostgreSQL full text)
finds the same lines, pages the same way and prunes the same way."""

from __future__ import annotations

import asyncio

import pytest

from crawlhub.control.logs import LogLine, LogQuery, LogStore
from crawlhub.control.logs.text import MAX_MESSAGE
from tests.control.logs.conftest import MakeLine, messages


async def test_written_lines_come_back_newest_first_with_every_field(
        log_store: LogStore, line: MakeLine) -> None:
    written = await log_store.write([
        line("first", ts=100.5, level="warning", source="job", job="news", run="r1",
             task="t1", host="h1", stream="stderr"),
        line("second", ts=101.0)])
    assert written == 2
    page = await log_store.search(LogQuery())
    assert [x.message for x in page.lines] == ["second", "first"]
    first = page.lines[1]
    assert (first.ts, first.level, first.source, first.job, first.run, first.task,
            first.host, first.stream) == (100.5, "warning", "job", "news", "r1", "t1",
                                          "h1", "stderr")
    assert page.lines[0].id is not None and first.id is not None
    assert page.lines[0].id > first.id
    assert page.next is None
    assert await log_store.count() == 2 and await log_store.last_id() == page.lines[0].id


async def test_filters_by_job_run_task_source_and_time(log_store: LogStore,
                                                       line: MakeLine) -> None:
    await log_store.write([
        line("a", ts=10.0, job="j1", run="r1", task="t1", source="job"),
        line("b", ts=20.0, job="j1", run="r2", task="t2", source="job"),
        line("c", ts=30.0, job="j2", run="r3", source="agent"),
        line("d", ts=40.0, source="hub")])
    assert await messages(log_store, job="j1") == ["b", "a"]
    assert await messages(log_store, run="r2") == ["b"]
    assert await messages(log_store, task="t1") == ["a"]
    assert await messages(log_store, source="agent") == ["c"]
    assert await messages(log_store, since=20.0, until=40.0) == ["c", "b"]
    assert await messages(log_store, job="j1", run="r1", task="t1", source="job") == ["a"]
    assert await messages(log_store, job="nobody") == []


async def test_level_is_a_minimum(log_store: LogStore, line: MakeLine) -> None:
    await log_store.write([line(level, level=level)
                           for level in ("debug", "info", "warning", "error", "critical")])
    assert await messages(log_store, level="warning") == ["critical", "error", "warning"]
    assert await messages(log_store, level="debug") == [
        "critical", "error", "warning", "info", "debug"]
    assert await messages(log_store, level="critical") == ["critical"]


async def test_search_words_phrases_prefixes_and_exclusions(log_store: LogStore,
                                                            line: MakeLine) -> None:
    await log_store.write([
        line("GET https://shop.example.com/item/42 read timeout after 30s"),
        line("proxy 10.0.0.7 refused: timeout"),
        line("timeout read"),
        line("parsed 25 items from page 3"),
    ])
    assert await messages(log_store, q="timeout") == [
        "timeout read", "proxy 10.0.0.7 refused: timeout",
        "GET https://shop.example.com/item/42 read timeout after 30s"]
    assert await messages(log_store, q='"read timeout"') == [
        "GET https://shop.example.com/item/42 read timeout after 30s"]
    assert await messages(log_store, q="TIMEOUT Read") == [
        "timeout read", "GET https://shop.example.com/item/42 read timeout after 30s"]
    assert await messages(log_store, q="ite*") == [
        "parsed 25 items from page 3",
        "GET https://shop.example.com/item/42 read timeout after 30s"]
    assert await messages(log_store, q='"read time*"') == [
        "GET https://shop.example.com/item/42 read timeout after 30s"]
    assert await messages(log_store, q="timeout -proxy -read") == []
    assert await messages(log_store, q="timeout -proxy") == [
        "timeout read", "GET https://shop.example.com/item/42 read timeout after 30s"]
    assert await messages(log_store, q="example.com/item") == [
        "GET https://shop.example.com/item/42 read timeout after 30s"]
    assert await messages(log_store, q="10.0.0.7") == ["proxy 10.0.0.7 refused: timeout"]
    assert await messages(log_store, q="-timeout") == ["parsed 25 items from page 3"]
    assert await messages(log_store, q="time") == []  # words, not substrings


async def test_search_combines_with_filters(log_store: LogStore, line: MakeLine) -> None:
    await log_store.write([line("fetch failed", job="a", level="error"),
                           line("fetch failed", job="b", level="error"),
                           line("fetch failed", job="a", level="info")])
    page = await log_store.search(LogQuery(q="failed", job="a", level="error"))
    assert [(x.job, x.level) for x in page.lines] == [("a", "error")]


@pytest.mark.parametrize("hostile", [
    '"', '"unterminated', "*", "NEAR(a b)", "a OR b", "AND", "NOT x", "col:value", "-",
    "'; DROP TABLE log_lines; --", "x <-> y", "!x & y:*", "^start", "a:*", "(((", "\\'",
    '"" ""', "-*", "a\x00b",
])
async def test_hostile_search_text_is_searched_never_an_error(
        log_store: LogStore, line: MakeLine, hostile: str) -> None:
    await log_store.write([line("NEAR(a b) col:value OR AND NOT -> x <-> y !x & y:*"),
                           line("plain")])
    page = await log_store.search(LogQuery(q=hostile))
    assert all(isinstance(x.message, str) for x in page.lines)
    assert await log_store.count() == 2  # nothing dropped


async def test_search_text_with_syntax_words_finds_them_as_words(log_store: LogStore,
                                                                  line: MakeLine) -> None:
    await log_store.write([line("NEAR the OR gate"), line("other")])
    assert await messages(log_store, q="NEAR OR") == ["NEAR the OR gate"]
    assert await messages(log_store, q='"near(the"') == ["NEAR the OR gate"]


async def test_punctuation_only_search_is_a_substring_search(log_store: LogStore,
                                                             line: MakeLine) -> None:
    await log_store.write([line("a -> b"), line("a b"), line("%_%")])
    assert await messages(log_store, q="->") == ["a -> b"]
    assert await messages(log_store, q="%_%") == ["%_%"]  # no LIKE wildcards


async def test_unicode_lines_are_stored_and_found(log_store: LogStore,
                                                  line: MakeLine) -> None:
    await log_store.write([line("数据库连接失败: 超时 (timeout)"), line("数据已保存"),
                           line("Überprüfung fehlgeschlagen ✓"), line("emoji 🚀 launch")])
    assert await messages(log_store, q="数据") == ["数据已保存", "数据库连接失败: 超时 (timeout)"]
    assert await messages(log_store, q="连接失败") == ["数据库连接失败: 超时 (timeout)"]
    assert await messages(log_store, q="据库") == ["数据库连接失败: 超时 (timeout)"]
    assert await messages(log_store, q="ÜBERPRÜFUNG") == ["Überprüfung fehlgeschlagen ✓"]
    assert await messages(log_store, q="🚀") == ["emoji 🚀 launch"]  # substring


async def test_nul_bytes_bad_utf8_and_huge_lines_are_stored(log_store: LogStore,
                                                            line: MakeLine) -> None:
    await log_store.write([line("nul\x00inside"), line(b"bytes \xff here"),  # type: ignore[arg-type]
                           line("big " + "x" * (MAX_MESSAGE * 2)), line("lone \udc80")])
    stored = await messages(log_store)
    assert stored[3] == "nul\ufffdinside" and stored[2] == "bytes \ufffd here"
    assert len(stored[1]) < MAX_MESSAGE + 50 and stored[1].endswith("characters]")
    assert stored[0] == "lone \ufffd"
    assert await messages(log_store, q="inside") == ["nul\ufffdinside"]


async def test_keyset_paging_walks_every_line_once(log_store: LogStore,
                                                   line: MakeLine) -> None:
    await log_store.write([line(f"line {i}", job="p") for i in range(25)])
    seen: list[str] = []
    before = None
    while True:
        page = await log_store.search(LogQuery(job="p", limit=10, before=before))
        seen += [x.message for x in page.lines]
        if page.next is None:
            break
        before = page.next
    assert seen == [f"line {i}" for i in reversed(range(25))]


async def test_keyset_paging_with_search_text(log_store: LogStore, line: MakeLine) -> None:
    await log_store.write([line(f"hit {i}" if i % 2 else f"miss {i}") for i in range(20)])
    first = await log_store.search(LogQuery(q="hit", limit=4))
    second = await log_store.search(LogQuery(q="hit", limit=4, before=first.next))
    assert [x.message for x in first.lines] == ["hit 19", "hit 17", "hit 15", "hit 13"]
    assert [x.message for x in second.lines] == ["hit 11", "hit 9", "hit 7", "hit 5"]


async def test_after_reads_forward_oldest_first(log_store: LogStore, line: MakeLine) -> None:
    await log_store.write([line(f"n{i}", job="j" if i % 2 else "k") for i in range(6)])
    start = (await log_store.search(LogQuery(limit=6))).lines[-1].id
    assert start is not None
    page = await log_store.search(LogQuery(after=start, job="j", limit=2))
    assert [x.message for x in page.lines] == ["n1", "n3"] and page.next is not None
    rest = await log_store.search(LogQuery(after=page.next, job="j", limit=2))
    assert [x.message for x in rest.lines] == ["n5"] and rest.next is None
    hits = await log_store.search(LogQuery(after=start, q="n4"))
    assert [x.message for x in hits.lines] == ["n4"]


async def test_a_uid_is_stored_once(log_store: LogStore, line: MakeLine) -> None:
    batch = [line("a"), line("b"), line("c")]
    assert await log_store.write(batch, ["1-0/0", "1-0/1", None]) == 3
    assert await log_store.write(batch, ["1-0/0", "1-0/1", None]) == 1  # the uid-less one
    assert await log_store.write([line("d"), line("d again")], ["2-0/0", "2-0/0"]) == 1
    assert sorted(await messages(log_store)) == ["a", "b", "c", "c", "d"]
    assert await messages(log_store, q="d") == ["d"]  # the index has it once too


async def test_ids_keep_growing_after_everything_is_pruned(log_store: LogStore,
                                                           line: MakeLine) -> None:
    await log_store.write([line("old", ts=1.0), line("old too", ts=2.0)])
    top = await log_store.last_id()
    assert await log_store.prune(max_age=60.0, now=1000.0) == 2
    assert await log_store.count() == 0
    await log_store.write([line("new")])
    page = await log_store.search(LogQuery(after=top))
    assert [x.message for x in page.lines] == ["new"]  # a tail at ``top`` sees it


async def test_prune_by_age_and_by_line_count(log_store: LogStore, line: MakeLine) -> None:
    await log_store.write([line(f"m{i} word", ts=float(i)) for i in range(30)])
    assert await log_store.prune(max_age=100.0, now=110.0) == 10  # ts < 10
    assert await log_store.prune(max_lines=15) == 5
    assert await log_store.count() == 15
    assert await messages(log_store, limit=100) == [f"m{i} word" for i in range(29, 14, -1)]
    assert len(await messages(log_store, q="word")) == 15  # pruned from the index too
    assert await messages(log_store, q="m3") == []
    assert await log_store.prune(max_age=1e9, max_lines=100, now=110.0) == 0


async def test_prune_deletes_in_batches(log_store: LogStore, line: MakeLine,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("crawlhub.control.logs.sql.PRUNE_BATCH", 3)
    await log_store.write([line(f"x{i}", ts=float(i)) for i in range(10)])
    assert await log_store.prune(max_lines=2) == 8
    assert await messages(log_store) == ["x9", "x8"]
    assert await messages(log_store, q="x5") == []


async def test_concurrent_writers_get_distinct_growing_ids(log_store: LogStore,
                                                           line: MakeLine) -> None:
    await asyncio.gather(*(log_store.write([line(f"w{n}-{i}") for i in range(20)])
                           for n in range(5)))
    page = await log_store.search(LogQuery(limit=1000))
    ids = [x.id for x in page.lines]
    assert len(ids) == 100 and len(set(ids)) == 100 and ids == sorted(ids, reverse=True)


async def test_write_of_nothing_is_nothing(log_store: LogStore) -> None:
    assert await log_store.write([]) == 0
    assert await log_store.count() == 0 and await log_store.last_id() == 0


async def test_lines_keep_their_given_level_names(log_store: LogStore) -> None:
    await log_store.write([LogLine(ts=1.0, message="m", level="critical")])
    assert (await log_store.search(LogQuery())).lines[0].level == "critical"


@pytest.mark.parametrize("narrow", [2000, 0], ids=["walk the filtered lines",
                                                   "walk the word matches"])
async def test_a_common_word_in_a_small_run_finds_the_same_lines_either_way(
        log_store: LogStore, line: MakeLine, monkeypatch: pytest.MonkeyPatch,
        narrow: int) -> None:
    monkeypatch.setattr("crawlhub.control.logs.sqlite.NARROW", narrow)  # SQLite's choice
    await log_store.write([line(f"common {i}", run=f"big-{i % 3}") for i in range(200)])
    await log_store.write([line("common a", run="small", task="t"), line("rare", run="small"),
                           line("common b", run="small", task="t")])
    await log_store.write([line(f"common {i}", run="big-0") for i in range(200, 220)])
    assert await messages(log_store, q="common", run="small") == ["common b", "common a"]
    assert await messages(log_store, q="common -b", task="t") == ["common a"]
    first = await log_store.search(LogQuery(q="common", run="small", limit=1))
    assert [x.message for x in first.lines] == ["common b"] and first.next is not None
    rest = await log_store.search(LogQuery(q="common", run="small", before=first.next))
    assert [x.message for x in rest.lines] == ["common a"]
    assert await messages(log_store, q="common", run="small", after=0) == [
        "common a", "common b"]

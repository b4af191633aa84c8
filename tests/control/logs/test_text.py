"""The shared text rules of the log store: cleaning, words, search text, times."""

from __future__ import annotations

import pytest

from crawlhub.control.logs import LogLine, LogQuery, LogQueryError, parse_search, parse_when
from crawlhub.control.logs.text import (
    MAX_MESSAGE,
    MAX_QUERY,
    MAX_TERMS,
    MAX_WORD,
    Term,
    clean_line,
    clean_text,
    words,
)


def test_words_split_on_punctuation_and_fold_case() -> None:
    assert words("GET https://Example.COM/item_1?x=2 -> 200") == [
        "get", "https", "example", "com", "item", "1", "x", "2", "200"]


def test_words_make_each_cjk_character_a_word_and_keep_other_scripts_whole() -> None:
    assert words("数据库连接失败 error码42") == ["数", "据", "库", "连", "接", "失", "败",
                                          "error", "码", "42"]
    assert words("Überprüfung naïve Ａｂｃ") == ["überprüfung", "naïve", "abc"]  # NFKC


def test_words_are_cut_so_blobs_do_not_bloat_the_index() -> None:
    assert words("x" * 500) == ["x" * MAX_WORD]


def test_clean_text_handles_nul_bad_utf8_surrogates_and_colour_codes() -> None:
    assert clean_text("a\x00b", 100) == "a\ufffdb"
    assert clean_text(b"ok \xff\xfe end", 100) == "ok \ufffd\ufffd end"
    assert clean_text("lone \ud800 surrogate", 100) == "lone \ufffd surrogate"
    assert clean_text("\x1b[31mred\x1b[0m\ttab\r\n", 100) == "red\ttab\r\n"
    clean_text("\ud800", 10).encode("utf-8")  # storable


def test_clean_line_truncates_a_huge_message_and_says_how_much() -> None:
    line = clean_line(LogLine(ts=1.0, message="y" * (MAX_MESSAGE + 10)))
    assert line.message.startswith("y" * MAX_MESSAGE)
    assert line.message.endswith("[truncated 10 characters]")


def test_clean_line_normalises_level_codes_and_time() -> None:
    line = clean_line(LogLine(ts=float("nan"), message="m", level="WARN", job="  ",
                              run="r" * 300, source=""))
    assert line.level == "warning" and line.job is None and len(line.run or "") == 200
    assert line.source == "job" and line.ts > 1e9
    assert clean_line(LogLine(ts=1.0, message="m", level="chatty")).level == "info"


@pytest.mark.parametrize("text, include, exclude", [
    ("timeout proxy", [Term(("timeout",)), Term(("proxy",))], []),
    ('"read timeout" -debug', [Term(("read", "timeout"))], [Term(("debug",))]),
    ("time*", [Term(("time",), prefix=True)], []),
    ('"read time*"', [Term(("read", "time"), prefix=True)], []),
    ('"read time"* x', [Term(("read", "time"), prefix=True), Term(("x",))], []),
    ("example.com", [Term(("example", "com"))], []),
    ('-"cache hit"', [], [Term(("cache", "hit"))]),
    ("数据库", [Term(("数", "据", "库"))], []),
])
def test_search_text_becomes_terms(text: str, include: list[Term], exclude: list[Term]
                                   ) -> None:
    search = parse_search(text)
    assert list(search.include) == include and list(search.exclude) == exclude


@pytest.mark.parametrize("hostile", [
    '"', '""', '"unterminated phrase', "*", "NEAR(a b)", "a OR b AND NOT c", "col:value",
    "-", "--", "'; DROP TABLE x; --", "a\x00b", "^x", "(((", "\\", "{a b}", "a:*", "!x",
    "x <-> y", "ｗｏｒｄ", "\ud800",
])
def test_hostile_search_text_never_fails(hostile: str) -> None:
    search = parse_search(hostile)
    for term in (*search.include, *search.exclude):
        assert all(w.isalnum() for w in term.words)  # nothing but letters and digits


def test_search_text_without_letters_or_digits_is_a_substring() -> None:
    assert parse_search(" -> ").substring == "->"
    assert parse_search("   ").empty


def test_search_text_is_bounded() -> None:
    with pytest.raises(LogQueryError, match="terms"):
        parse_search(" ".join(f"w{i}" for i in range(MAX_TERMS + 1)))
    with pytest.raises(LogQueryError, match="characters"):
        parse_search("a" * (MAX_QUERY + 1))


def test_times_are_unix_seconds_iso_or_ages() -> None:
    assert parse_when("1714564800") == 1714564800.0
    assert parse_when("2024-05-01T12:00:00Z") == 1714564800.0
    assert parse_when("2024-05-01T12:00:00") == 1714564800.0  # no offset: UTC
    assert parse_when("2024-05-01T14:00:00+02:00") == 1714564800.0
    assert parse_when("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_when("1h30m", now=10_000.0) == 10_000.0 - 5400
    assert parse_when(" ") is None and parse_when(None) is None
    with pytest.raises(LogQueryError, match="since='yesterday'"):
        parse_when("yesterday")
    with pytest.raises(LogQueryError, match="finite"):
        parse_when("nan", name="until")


def test_a_query_checks_level_and_limit() -> None:
    assert LogQuery(level="WARN").min_rank() == 2
    with pytest.raises(LogQueryError, match="level='loud'"):
        LogQuery(level="loud")
    with pytest.raises(LogQueryError, match="limit"):
        LogQuery(limit=0)

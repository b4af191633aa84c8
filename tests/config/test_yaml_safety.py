"""Hostile or careless YAML ends in a ConfigError naming file, line and place: duplicate
keys, alias bombs, recursive aliases and very deep nesting, refused before expanding."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from crawlhub.config import load_config, yamlread
from crawlhub.config.yamlread import MAX_DEPTH, MAX_NODES
from crawlhub.core.errors import ConfigError, ConfigErrors

from .conftest import WriteFiles

MB = 1024 * 1024


def refusal(main: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    assert not isinstance(info.value, ConfigErrors), str(info.value)
    return info.value


def peak_memory(action: Callable[[], object]) -> int:
    """Bytes Python allocated at the peak of ``action`` (a bound, not a timing)."""
    tracemalloc.start()
    try:
        action()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_duplicate_key_names_both_lines(write: WriteFiles) -> None:
    main = write({"main.yaml": "server:\n  port: 8000\n  bind: 0.0.0.0\n  port: 9000\n"})
    err = refusal(main)
    assert (err.file, err.entry, err.key) == ("main.yaml", "server", "port")
    assert "duplicate key 'port' at line 4: line 2 already sets it" in str(err)


def test_a_duplicate_key_in_an_outbound_names_the_entry(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": "include: [more.yaml]\n",
            "more.yaml": """
                outbound:
                  - name: first
                  - name: spider
                    init: {key: a, url: 'redis://h/0', key: b}
                """,
        }
    )
    err = refusal(main)
    assert (err.file, err.entry, err.key) == ("more.yaml", "outbound[1] 'spider'", "init.key")
    assert "duplicate key 'key' at line 4: line 4 already sets it" in str(err)


def test_duplicate_top_level_sections_are_refused(write: WriteFiles) -> None:
    main = write({"main.yaml": "outbound:\n  - name: a\nproject: p\noutbound:\n  - name: b\n"})
    err = refusal(main)
    assert (err.file, err.key) == ("main.yaml", "outbound")
    assert "line 4" in str(err) and "line 1" in str(err)


def test_anchors_and_merge_keys_that_override_still_load(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                outbound:
                  - name: a
                    class: redis_list
                    init: &redis {url: 'redis://127.0.0.1:6379/0', key: a}
                  - {name: b, class: redis_list, init: {<<: *redis, key: b}}
                """
        }
    )
    cfg = load_config(main, env={})
    assert [o.init for o in cfg.outbound] == [
        {"url": "redis://127.0.0.1:6379/0", "key": "a"},
        {"url": "redis://127.0.0.1:6379/0", "key": "b"},
    ]


def test_an_alias_bomb_is_refused_before_it_expands(write: WriteFiles) -> None:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    main = write({"main.yaml": "\n".join(lines) + "\n"})  # 9**9 = 387 million strings

    errors: list[ConfigError] = []

    def load() -> None:
        try:
            load_config(main, env={})
        except ConfigError as exc:
            errors.append(exc)

    assert peak_memory(load) < 100 * MB
    assert len(errors) == 1 and not isinstance(errors[0], ConfigErrors)
    assert errors[0].file == "main.yaml"
    assert f"aliases expand this file by more than {MAX_NODES} values" in str(errors[0])


def test_a_mapping_alias_bomb_inside_an_outbound_is_refused(write: WriteFiles) -> None:
    text = "x0: &x0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8}\n"
    for i in range(1, 9):
        keys = ", ".join(f"k{j}: *x{i - 1}" for j in range(8))
        text += f"x{i}: &x{i} {{{keys}}}\n"
    main = write({"main.yaml": text.replace("x8: &x8", "outbound:\n  - name: o\n    init:")})
    assert peak_memory(lambda: refusal(main)) < 100 * MB
    assert "alias bomb" in str(refusal(main))


def test_a_recursive_alias_is_refused(write: WriteFiles) -> None:
    main = write({"main.yaml": "outbound:\n  - &o {name: o, init: {self: *o}}\n"})
    err = refusal(main)
    assert "recursive alias" in str(err)
    assert err.entry == "outbound[0] 'o'"


@pytest.mark.parametrize(
    "text",
    [
        "x: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "x: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n",
        "".join(" " * depth + f"k{depth}:\n" for depth in range(2_000)) + " " * 2_000 + "v: 1\n",
    ],
    ids=["flow-lists", "flow-mappings", "block-mappings"],
)
def test_very_deep_nesting_is_a_config_error_not_a_recursion_error(
    write: WriteFiles, text: str
) -> None:
    main = write({"main.yaml": text})
    errors: list[ConfigError] = []

    def load() -> None:
        try:
            load_config(main, env={})
        except ConfigError as exc:
            errors.append(exc)

    assert peak_memory(load) < 100 * MB
    assert len(errors) == 1, "expected a ConfigError, not a crash"
    assert errors[0].file == "main.yaml"
    assert f"nesting deeper than {MAX_DEPTH} levels" in str(errors[0])


def test_a_large_file_without_aliases_is_not_taken_for_a_bomb(
    write: WriteFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(yamlread, "MAX_NODES", 100)  # the limit counts what aliases add
    rows = "".join(f"  - {{name: o{i}, task_src: {i}}}\n" for i in range(200))
    main = write({"main.yaml": "outbound:\n" + rows})
    assert len(load_config(main, env={}).outbound) == 200

    bomb = "outbound:\n  - &o {name: o, init: {a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}}\n"
    bomb += "".join(f"  - {{<<: *o, name: o{i}}}\n" for i in range(20))
    assert "alias bomb" in str(refusal(write({"main.yaml": bomb})))

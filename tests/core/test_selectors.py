"""Specs of the safe selector compiler: seed selectors, None semantics, errors, escapes.

Each test states one behaviour of ``crawlhub.core.selectors``.
"""

from __future__ import annotations

import ast
import builtins
import logging
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawlhub.core import selectors as selectors_module
from crawlhub.core.errors import ConfigError, SelectorError
from crawlhub.core.selectors import (
    MATCH_ALL,
    MAX_DEPTH,
    MAX_SELECTOR_LENGTH,
    MAX_SEQUENCE_LENGTH,
    Selector,
    SelectorSet,
    compile_selector,
    compile_selectors,
    with_location,
)

CORPUS = Path(__file__).with_name("selector_escape_corpus.txt")

# The seed's (taskHUB 004) real selectors.
SEED_INBOUND = [
    "submitter == 'taskhub' and (company_name or credit_no or company_code) "
    "and int(task_src) in [1, 11, 5, 3, 22, 21, 7]",
    "task_type == '找新' and detail_url and province != 'AH' and task_src == 0",
    "task_type == '找新' and province in ['JS', 'TJ', 'ZJ'] and task_result == 1000 "
    "and task_src == 0",
    "task_type == '小微企业补充行业'",
]
SEED_OUTBOUND = (
    "task_src in [3] and not detail_url and data_type and task_parms['province'] == 'GD'"
)


# --------------------------------------------------------------------------- seed selectors


@pytest.mark.parametrize(
    ("text", "task", "expected"),
    [
        ("int(task_src) in [1, 3] and not detail_url", {"task_src": "3"}, True),
        ("int(task_src) in [1, 3] and not detail_url", {"task_src": 1, "detail_url": ""}, True),
        (
            "int(task_src) in [1, 3] and not detail_url",
            {"task_src": "3", "detail_url": "http://a"},
            False,
        ),
        ("int(task_src) in [1, 3] and not detail_url", {"task_src": "7"}, False),
        ("task_parms['province'] == 'GD'", {"task_parms": {"province": "GD"}}, True),
        ("task_parms['province'] == 'GD'", {"task_parms": {"province": "JS"}}, False),
        (SEED_INBOUND[0], {"submitter": "taskhub", "credit_no": "9144", "task_src": "11"}, True),
        (SEED_INBOUND[0], {"submitter": "taskhub", "task_src": "11"}, False),
        (SEED_INBOUND[0], {"submitter": "other", "company_name": "ACME", "task_src": 1}, False),
        (
            SEED_INBOUND[1],
            {"task_type": "找新", "detail_url": "http://x", "province": "GD", "task_src": 0},
            True,
        ),
        (
            SEED_INBOUND[1],
            {"task_type": "找新", "detail_url": "http://x", "province": "AH", "task_src": 0},
            False,
        ),
        (
            SEED_INBOUND[2],
            {"task_type": "找新", "province": "TJ", "task_result": 1000, "task_src": 0},
            True,
        ),
        (
            SEED_INBOUND[2],
            {"task_type": "找新", "province": "GD", "task_result": 1000, "task_src": 0},
            False,
        ),
        (SEED_INBOUND[3], {"task_type": "小微企业补充行业"}, True),
        (SEED_INBOUND[3], {"task_type": "找新"}, False),
        (
            SEED_OUTBOUND,
            {"task_src": 3, "data_type": "change", "task_parms": {"province": "GD"}},
            True,
        ),
        (
            SEED_OUTBOUND,
            {"task_src": 3, "data_type": "change", "task_parms": {"province": "BJ"}},
            False,
        ),
        (SEED_OUTBOUND, {"task_src": 3, "data_type": "", "task_parms": {"province": "GD"}}, False),
    ],
)
def test_seed_selector_decides_realistic_task(
    text: str, task: dict[str, Any], expected: bool
) -> None:
    assert compile_selector(text)(task) is expected


def test_seed_inbound_list_reports_the_first_selector_that_matches() -> None:
    inbound = compile_selectors(SEED_INBOUND)
    task = {"task_type": "找新", "province": "ZJ", "task_result": 1000, "task_src": 0}
    matched = inbound.match(task)
    assert matched is inbound.selectors[2]
    assert matched.text == SEED_INBOUND[2]


# --------------------------------------------------------------------------- None semantics


def test_missing_name_reads_as_none() -> None:
    assert compile_selector("detail_url is None").evaluate({}) is True
    assert compile_selector("not detail_url")({}) is True


def test_missing_subscript_key_reads_as_none() -> None:
    assert compile_selector("task_parms['province']").evaluate({"task_parms": {}}) is None


def test_subscript_of_missing_container_reads_as_none() -> None:
    assert compile_selector("task_parms['province']").evaluate({}) is None


@pytest.mark.parametrize("container", [5, 1.5, True, object()])
def test_subscript_of_non_container_reads_as_none(container: Any) -> None:
    assert compile_selector("x['k']").evaluate({"x": container}) is None


def test_nested_subscripts_read_through_dicts_and_lists() -> None:
    task = {"meta": {"pages": [{"url": "a"}, {"url": "b"}]}}
    assert compile_selector("meta['pages'][-1]['url']").evaluate(task) == "b"
    assert compile_selector("meta['pages'][5]['url']").evaluate(task) is None
    assert compile_selector("meta['pages']['url']").evaluate(task) is None


def test_integer_subscript_of_string_reads_a_character() -> None:
    assert compile_selector("province[0] == 'G'")({"province": "GD"}) is True


def test_bare_function_name_reads_the_task_key() -> None:
    assert compile_selector("len").evaluate({"len": 3}) == 3
    assert compile_selector("len(len)").evaluate({"len": "abc"}) == 3


def test_selector_reports_the_task_keys_it_reads() -> None:
    assert compile_selector(SEED_OUTBOUND).names == {
        "task_src",
        "detail_url",
        "data_type",
        "task_parms",
    }


# --------------------------------------------------------------------------- runtime errors


def test_runtime_error_counts_as_not_matching() -> None:
    selector = compile_selector("int(task_src) == 1")
    assert selector({"task_src": None}) is False
    assert selector({"task_src": "abc"}) is False
    assert selector.errors == 2


def test_runtime_error_propagates_from_evaluate() -> None:
    with pytest.raises(TypeError):
        compile_selector("int(task_src) == 1").evaluate({})


def test_runtime_error_is_logged_once_per_selector_with_task_uuid(
    caplog: pytest.LogCaptureFixture,
) -> None:
    selector = compile_selector("int(task_src) == 1")
    with caplog.at_level(logging.WARNING, logger="crawlhub.selectors"):
        for n in range(5):
            assert selector({"task_uuid": f"uuid-{n}", "task_src": "x"}) is False
    records = [r for r in caplog.records if r.name == "crawlhub.selectors"]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "uuid-0" in message
    assert "int(task_src) == 1" in message
    assert "ValueError" in message


@pytest.mark.parametrize(
    "text",
    [
        "1 / retry_times",
        "len(retry_times) > 0",
        "min(a) > 0",
        "a < b",
        "float(a) > 1",
        "{a} == {1}",
        "abs(a) > 0",
    ],
)
def test_no_evaluation_error_escapes_call(text: str) -> None:
    task = {"retry_times": 0, "a": [], "b": "s"}
    assert compile_selector(text)(task) is False


def test_string_repetition_from_task_values_is_bounded() -> None:
    selector = compile_selector("len(name * count) > 0")
    assert selector({"name": "ab", "count": 3}) is True
    assert selector({"name": "ab", "count": 10**12}) is False
    with pytest.raises(ValueError, match=str(MAX_SEQUENCE_LENGTH)):
        selector.evaluate({"name": "ab", "count": 10**12})


def test_percent_formats_no_strings_from_the_task() -> None:
    selector = compile_selector("(fmt % 1) != ''")
    assert selector({"fmt": "%0999999999d"}) is False
    assert compile_selector("retry_times % 2 == 1")({"retry_times": 3}) is True


def test_non_mapping_task_does_not_raise() -> None:
    assert compile_selector("x == 1")(None) is False  # type: ignore[arg-type]


# --------------------------------------------------------------------------- allowed constructs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("int(s)", 12),
        ("str(n)", "7"),
        ("float(s)", 12.0),
        ("len(items)", 3),
        ("bool(items)", True),
        ("min(items)", 1),
        ("max(n, 3)", 7),
        ("abs(neg)", 5),
        ("any(flags)", True),
        ("all(flags)", False),
    ],
)
def test_whitelisted_function_calls_the_real_builtin(text: str, expected: Any) -> None:
    task = {"s": "12", "n": 7, "items": [1, 2, 3], "neg": -5, "flags": [0, 1]}
    value = compile_selector(text).evaluate(task)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n + 1 - 2", 6),
        ("n * 2", 14),
        ("n / 2", 3.5),
        ("n // 2", 3),
        ("n % 4", 3),
        ("-n", -7),
        ("+n", 7),
        ("not n", False),
        ("'ab' * 2", "abab"),
        ("[0] * 3", [0, 0, 0]),
        ("s + 'x'", "12x"),
        ("1 < n <= 7", True),
        ("n is None", False),
        ("n is not None", True),
        ("n not in (1, 2)", True),
        ("'a' if n > 5 else 'b'", "a"),
        ("n > 5 or missing", True),
        ("{'k': n}['k']", 7),
        ("{1, 2} == {2, 1}", True),
        ("(1, n)[1]", 7),
        ("b'x' == b'x'", True),
        ("1.5 < n", True),
        ("True and None is None", True),
    ],
)
def test_allowed_operators_and_literals_evaluate_like_python(text: str, expected: Any) -> None:
    assert compile_selector(text).evaluate({"n": 7, "s": "12"}) == expected


def test_surrounding_whitespace_is_ignored() -> None:
    selector = compile_selector("  task_src == 3\n")
    assert selector.text == "task_src == 3"
    assert selector({"task_src": 3}) is True


# --------------------------------------------------------------------------- compile-time rejects


def _corpus() -> list[str]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_escape_corpus_is_large_enough() -> None:
    assert len(_corpus()) >= 40


@pytest.mark.parametrize("text", _corpus())
def test_escape_corpus_entry_is_refused_at_compile_time(text: str) -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector(text)
    shown = text.strip()[:200]
    assert f'"{shown}' in str(info.value)


@pytest.mark.parametrize(
    ("text", "construct"),
    [
        ("x.__class__", 'selector "x.__class__" uses attribute access (.__class__)'),
        ("(lambda: 1)()", "lambda"),
        ("[x for x in ()]", "comprehension"),
        ("(x for x in ())", "generator expression"),
        ("(y := 1)", "assignment expression"),
        ('f"{x}"', "f-string"),
        ("9**9", "power operator"),
        ("'a' * 10**10", "repetition"),
        ("'a' * 1000000000", "repetition"),
        ("'%d' % x", "string formatting"),
        ("open('/etc/passwd')", "calls open()"),
        ("int(x, base=2)", "keyword arguments to int()"),
        ("int(1)(2)", "call of a computed value"),
        ("x[y]", "computed key"),
        ("x[1:2]", "slice"),
        ("__builtins__", "reserved name __builtins__"),
        ("{**a}", "dict unpacking"),
        ("[*a]", "star unpacking"),
        ("x << 1", "shift operator"),
        ("~x", "bitwise operator"),
        ("...", "constant Ellipsis"),
    ],
)
def test_forbidden_construct_is_named_in_the_error(text: str, construct: str) -> None:
    with pytest.raises(SelectorError, match="which selectors do not allow") as info:
        compile_selector(text)
    assert construct in str(info.value)


def test_unicode_lookalike_names_are_normalised_then_refused() -> None:
    # Python folds identifiers with NFKC: these are __import__ and eval once parsed.
    with pytest.raises(SelectorError, match="calls __import__"):
        compile_selector("__ｉｍｐｏｒｔ__('os')")
    with pytest.raises(SelectorError, match="calls eval"):
        compile_selector("𝐞𝐯𝐚𝐥('1')")
    with pytest.raises(SelectorError, match="reserved name __builtins__"):
        compile_selector("__ｂｕｉｌｔｉｎｓ__")


def test_error_points_at_the_column_in_characters() -> None:
    with pytest.raises(SelectorError, match="at column 25"):
        compile_selector("task_type == '找新' and x.y")


def test_syntax_error_quotes_text_and_position() -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector("int(task_src in [1, 3]")
    message = str(info.value)
    assert '"int(task_src in [1, 3]"' in message
    assert "is not a valid expression" in message
    assert "column 4" in message


def test_null_byte_is_a_selector_error() -> None:
    with pytest.raises(SelectorError):
        compile_selector("x == '\x00'\x00")


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_empty_selector_is_refused(text: str) -> None:
    with pytest.raises(SelectorError, match="empty"):
        compile_selector(text)


@pytest.mark.parametrize("value", [1, True, None, ["a == 1"]])
def test_non_string_selector_is_refused(value: Any) -> None:
    with pytest.raises(SelectorError, match="not a string"):
        compile_selector(value)


def test_overlong_selector_is_refused() -> None:
    text = " or ".join(["task_src == 1"] * (MAX_SELECTOR_LENGTH // 10))
    with pytest.raises(SelectorError, match="characters long"):
        compile_selector(text)


def test_deeply_nested_selector_is_refused() -> None:
    text = "not " * (MAX_DEPTH + 1) + "x"
    with pytest.raises(SelectorError, match="nested more than"):
        compile_selector(text)


def test_deeply_nested_parentheses_are_refused() -> None:
    with pytest.raises(SelectorError):
        compile_selector("(" * 300 + "x" + ")" * 300)


def test_selector_error_is_a_config_error_with_bare_reason() -> None:
    with pytest.raises(ConfigError) as info:
        compile_selector("x.y")
    assert isinstance(info.value, SelectorError)
    assert info.value.reason == str(info.value)


# --------------------------------------------------------------------------- selector sets


def test_selector_set_match_returns_first_matching_selector() -> None:
    selectors = compile_selectors(["a == 1", "b == 2", "a == 1 or b == 2"])
    assert selectors.match({"a": 1, "b": 2}) is selectors.selectors[0]
    assert selectors.match({"b": 2}) is selectors.selectors[1]
    assert selectors.match({}) is None


def test_selector_set_matches_when_any_selector_matches() -> None:
    selectors = compile_selectors(["a == 1", "b == 2"])
    assert selectors.matches({"b": 2}) is True
    assert selectors.matches({"b": 3}) is False


def test_selector_set_skips_a_selector_that_errors() -> None:
    selectors = compile_selectors(["int(a) == 1", "b == 2"])
    assert selectors.match({"a": "x", "b": 2}) is selectors.selectors[1]


def test_empty_selector_set_matches_every_task() -> None:
    selectors = compile_selectors([])
    assert selectors.matches({}) is True
    assert selectors.matches({"anything": 1}) is True
    assert selectors.match({}) is MATCH_ALL
    assert MATCH_ALL({}) is True


def test_none_selector_list_is_empty() -> None:
    assert compile_selectors(None).matches({"x": 1}) is True


def test_single_string_counts_as_a_list_of_one() -> None:
    selectors = compile_selectors("a == 1")
    assert selectors.texts == ("a == 1",)


def test_selector_set_exposes_texts_in_order() -> None:
    assert compile_selectors(["b", "a"]).texts == ("b", "a")
    assert len(compile_selectors(["b", "a"])) == 2


def test_selector_list_error_names_the_index() -> None:
    with pytest.raises(SelectorError) as info:
        compile_selectors(["a == 1", "a.b"])
    assert info.value.key == "selector[1]"
    assert str(info.value).startswith("key 'selector[1]': selector \"a.b\"")
    assert info.value.reason.startswith('selector "a.b" uses attribute access')


def test_with_location_adds_file_and_entry_and_keeps_key() -> None:
    with pytest.raises(SelectorError) as info:
        compile_selectors(["a.b"])
    located = with_location(info.value, file="main.yaml", entry="outbound[2] 'zongju'")
    assert located.file == "main.yaml"
    assert located.entry == "outbound[2] 'zongju'"
    assert located.key == "selector[0]"
    assert located.reason == info.value.reason
    assert str(located).startswith("file main.yaml, entry outbound[2] 'zongju', key 'selector[0]'")


def test_repr_shows_the_text() -> None:
    assert repr(compile_selector("a == 1")) == "Selector('a == 1')"
    assert repr(compile_selectors(["a == 1"])) == "SelectorSet(['a == 1'])"


# --------------------------------------------------------------------------- compile once


def test_selector_is_compiled_once_and_evaluated_without_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    selector = compile_selector(SEED_OUTBOUND)
    assert isinstance(selector, Selector)
    assert isinstance(selector.code, types.CodeType)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("selector re-parsed or re-compiled at evaluation")

    monkeypatch.setattr(ast, "parse", refuse)
    monkeypatch.setattr(builtins, "compile", refuse)
    task = {"task_src": 3, "data_type": "x", "task_parms": {"province": "GD"}}
    for _ in range(100):
        assert selector(task) is True
    assert selector.evaluate(task) is True


def test_selector_code_has_no_builtins() -> None:
    selector = compile_selector("x == 1")
    function = selector._match
    assert function.__globals__["__builtins__"] == {}
    assert "eval" not in function.__globals__
    assert "getattr" not in function.__globals__


# --------------------------------------------------------------------------- property


PROPERTY_SELECTORS = [
    *SEED_INBOUND,
    SEED_OUTBOUND,
    "int(task_src) in [1, 3] and not detail_url",
    "task_parms['province'] == 'GD'",
    "task_parms['pages'][0] if task_parms else province",
    "len(province) > 1 and province[-1] == 'D'",
    "min(task_src, task_result) < 5 or max(retry_times, 0) > 2",
    "abs(task_result) + retry_times * 2 - 1 > task_src / 3",
    "str(task_src) + 'x' == '3x' or float(retry_times) >= 1.5",
    "any(task_parms) and not all(detail_url)",
    "bool(company_name) != bool(credit_no)",
    "retry_times // 2 == 1 and retry_times % 2 == 0",
    "province * retry_times",
    "[province, task_src] == [None, None] or {task_src} != {1}",
    "task_src is None or task_src is not 0",
    "(task_parms or {})['province'] in ('GD', 'JS', None)",
]

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**6), max_value=10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=8,
)
_task_parms = st.fixed_dictionaries(
    {},
    optional={
        "province": st.sampled_from(["GD", "JS", None, 3]),
        "pages": st.lists(_json, max_size=3),
    },
)
# Per key: realistic values two times in three, any JSON value otherwise.
_PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "task_src": st.sampled_from([0, 1, 3, 7, 11, "3", "1", "x"]),
    "detail_url": st.sampled_from(["", None, "http://a.test/1"]),
    "task_parms": _task_parms,
    "province": st.sampled_from(["GD", "JS", "TJ", "ZJ", "AH", "SD"]),
    "task_result": st.sampled_from([1000, 0, 500, -3]),
    "retry_times": st.integers(min_value=0, max_value=5),
    "company_name": st.sampled_from(["ACME", ""]),
    "credit_no": st.sampled_from(["91440300", ""]),
    "company_code": st.sampled_from(["C1", ""]),
    "submitter": st.sampled_from(["taskhub", "other"]),
    "task_type": st.sampled_from(["找新", "小微企业补充行业", "破码"]),
    "data_type": st.sampled_from(["change", ""]),
}
_tasks = st.fixed_dictionaries(
    {}, optional={name: st.one_of(value, value, _json) for name, value in _PLAUSIBLE.items()}
)

_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "int": int,
    "str": str,
    "float": float,
    "len": len,
    "bool": bool,
    "min": min,
    "max": max,
    "abs": abs,
    "any": any,
    "all": all,
}


def _reference(node: ast.AST, task: dict[str, Any]) -> Any:
    """A plain tree-walking reading of the documented semantics."""
    match node:
        case ast.Expression(body=body):
            return _reference(body, task)
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            return task.get(name)
        case ast.BoolOp(op=ast.And(), values=values):
            result: Any = True
            for value_node in values:
                result = _reference(value_node, task)
                if not result:
                    return result
            return result
        case ast.BoolOp(op=ast.Or(), values=values):
            result = False
            for value_node in values:
                result = _reference(value_node, task)
                if result:
                    return result
            return result
        case ast.UnaryOp(op=op, operand=operand):
            value = _reference(operand, task)
            return {ast.Not: lambda v: not v, ast.USub: lambda v: -v, ast.UAdd: lambda v: +v}[
                type(op)
            ](value)
        case ast.BinOp(left=left, op=op, right=right):
            a, b = _reference(left, task), _reference(right, task)
            if isinstance(op, ast.Mult):
                for seq, n in ((a, b), (b, a)):
                    if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                        if len(seq) * n > MAX_SEQUENCE_LENGTH:
                            raise ValueError("too long")
                return a * b
            if isinstance(op, ast.Mod) and isinstance(a, (str, bytes)):
                raise TypeError("no formatting")
            ops = {
                ast.Add: lambda x, y: x + y,
                ast.Sub: lambda x, y: x - y,
                ast.Div: lambda x, y: x / y,
                ast.FloorDiv: lambda x, y: x // y,
                ast.Mod: lambda x, y: x % y,
            }
            return ops[type(op)](a, b)
        case ast.Compare(left=left, ops=ops_, comparators=comparators):
            current = _reference(left, task)
            for cmp, comparator in zip(ops_, comparators, strict=True):
                other = _reference(comparator, task)
                ok = {
                    ast.Eq: lambda x, y: x == y,
                    ast.NotEq: lambda x, y: x != y,
                    ast.Lt: lambda x, y: x < y,
                    ast.LtE: lambda x, y: x <= y,
                    ast.Gt: lambda x, y: x > y,
                    ast.GtE: lambda x, y: x >= y,
                    ast.In: lambda x, y: x in y,
                    ast.NotIn: lambda x, y: x not in y,
                    ast.Is: lambda x, y: x is y,
                    ast.IsNot: lambda x, y: x is not y,
                }[type(cmp)](current, other)
                if not ok:
                    return ok
                current = other
            return ok
        case ast.IfExp(test=test, body=body, orelse=orelse):
            return _reference(body if _reference(test, task) else orelse, task)
        case ast.List(elts=elts):
            return [_reference(e, task) for e in elts]
        case ast.Tuple(elts=elts):
            return tuple(_reference(e, task) for e in elts)
        case ast.Set(elts=elts):
            return {_reference(e, task) for e in elts}
        case ast.Dict(keys=keys, values=values):
            built = {}
            for k, v in zip(keys, values, strict=True):
                assert k is not None
                built[_reference(k, task)] = _reference(v, task)
            return built
        case ast.Subscript(value=value, slice=key_node):
            container = _reference(value, task)
            key = _reference(key_node, task)
            if isinstance(container, dict):
                return container.get(key)
            if isinstance(container, (str, bytes, list, tuple)) and type(key) is int:
                return container[key] if -len(container) <= key < len(container) else None
            return None
        case ast.Call(func=ast.Name(id=name), args=args):
            return _FUNCTIONS[name](*(_reference(a, task) for a in args))
    raise AssertionError(f"reference has no rule for {ast.dump(node)}")


_COMPILED = [(compile_selector(text), ast.parse(text, mode="eval")) for text in PROPERTY_SELECTORS]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and repr(a) == repr(b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=_tasks)
def test_valid_selectors_never_raise_and_agree_with_reference(task: dict[str, Any]) -> None:
    for selector, tree in _COMPILED:
        outcome = selector(task)
        assert type(outcome) is bool
        try:
            expected = _reference(tree, task)
        except Exception:
            assert outcome is False, selector.text
            continue
        assert outcome is bool(expected), selector.text
        assert _same(selector.evaluate(task), expected), selector.text


def test_selector_set_type_is_public() -> None:
    assert isinstance(compile_selectors([]), SelectorSet)
    assert selectors_module.__all__


@pytest.mark.parametrize("texts", [42, {"task_src": 3}, 3.5, True])
def test_a_selector_list_that_is_not_a_list_is_a_selector_error(texts: Any) -> None:
    with pytest.raises(SelectorError) as info:
        compile_selectors(texts)
    assert info.value.key == "selector"
    assert "must be a list of expressions" in str(info.value)


@pytest.mark.parametrize("item", [42, True, None, ["a == 1"]])
def test_a_selector_that_is_not_a_string_is_a_selector_error_at_its_index(item: Any) -> None:
    with pytest.raises(SelectorError) as info:
        compile_selectors(["a == 1", item])
    assert info.value.key == "selector[1]"
    assert "not a string" in str(info.value)

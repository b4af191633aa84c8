"""The JSON codec's checks: one pass finds a value nested too deeply and a NaN or
infinity anywhere (dict subclasses such as Task included); strict dumps refuse them."""

from __future__ import annotations

import math
from typing import Any

import pytest

from crawlhub.core import jsoncodec
from crawlhub.core.task import Task


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth - 1):
        value = {"a": value} if i % 2 else [value]
    return {"top": value} if depth > 1 else {"top": leaf}


@pytest.mark.parametrize("depth", [1, 2, 5, jsoncodec.MAX_DEPTH])
def test_depth_at_the_limit_is_not_too_deep(depth: int) -> None:
    assert jsoncodec.json_shape(nested(depth)) == (False, True)
    assert not jsoncodec.too_deep(nested(depth))


def test_one_level_past_the_limit_is_too_deep_at_any_depth() -> None:
    assert jsoncodec.too_deep(nested(jsoncodec.MAX_DEPTH + 1))
    assert jsoncodec.too_deep(nested(50_000))  # iterative: no RecursionError
    assert jsoncodec.too_deep([[[1]]], 2) and not jsoncodec.too_deep([[[1]]], 3)
    assert jsoncodec.too_deep(({"a": (1,)},), 2)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["top", "list", "dict", "tuple", "task"])
def test_a_nan_or_infinity_anywhere_is_seen(bad: float, where: str) -> None:
    value: Any = {
        "top": {"x": bad},
        "list": {"x": [1, "a", [2.5, bad]]},
        "dict": {"x": {"y": {"z": bad}}},
        "tuple": {"x": (None, (bad,))},
        "task": {"x": Task({"y": Task({"z": bad})})},
    }[where]
    assert jsoncodec.json_shape(value) == (False, False)
    assert jsoncodec.json_shape(Task(value)) == (False, False)
    with pytest.raises(ValueError, match="NaN and Infinity are not JSON"):
        jsoncodec.dumps_strict({"t": Task(value), "d": None})


def test_finite_values_pass_and_keep_their_nulls() -> None:
    value = Task({"a": None, "b": [1.5, -0.0, 1e308, True, "NaN"], "c": {"d": None}})
    assert jsoncodec.json_shape(value) == (False, True)
    assert jsoncodec.dumps_strict(value) == jsoncodec.dumps(value)
    assert jsoncodec.json_shape(math.nan) == (False, False)
    assert jsoncodec.json_shape("x") == (False, True)


def test_dumps_strict_trusts_a_caller_that_checked() -> None:
    # finite=True skips the second look: for callers that ran json_shape themselves
    assert jsoncodec.dumps_strict({"a": math.nan}, finite=True) == '{"a":null}'

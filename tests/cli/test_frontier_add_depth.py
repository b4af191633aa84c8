"""``crawlhub frontier add`` refuses seeds nested past the one depth limit (MAX_DEPTH),
naming the line, and admits the others."""

from __future__ import annotations

import io

from crawlhub.cli.frontier import parse_seeds
from crawlhub.core.jsoncodec import MAX_DEPTH


def deep_seed(depth: int) -> str:
    """A seed line nested ``depth`` levels deep (its ``meta`` holds the nesting)."""
    inner = '{"a":' * (depth - 1) + "1" + "}" * (depth - 1)
    return '{"url":"http://example.com/deep","meta":' + inner + "}"


def test_a_seed_line_nested_past_the_limit_is_reported_with_its_line_number() -> None:
    text = "\n".join(["http://example.com/a", deep_seed(MAX_DEPTH + 1), deep_seed(2000),
                      deep_seed(MAX_DEPTH)])
    problems: list[str] = []

    seeds = [seed.url for seed, _, _ in parse_seeds(io.StringIO(text), problems)]

    assert seeds == ["http://example.com/a", "http://example.com/deep"]
    assert [p.split(":")[0] for p in problems] == ["line 2", "line 3"]
    assert all(f"more than {MAX_DEPTH} levels deep" in p for p in problems)


def test_a_seed_array_nested_past_the_limit_is_reported_by_item() -> None:
    problems: list[str] = []

    seeds = list(parse_seeds(io.StringIO(f"[{deep_seed(MAX_DEPTH + 1)}]"), problems))

    assert seeds == []
    assert problems[0].startswith("item 0: ")
    assert f"more than {MAX_DEPTH} levels deep" in problems[0]

"""Time segments: fixed UTC spans, future not_before, pluggable resolvers."""

from __future__ import annotations

import pytest

from crawlhub.core.errors import ConfigError
from crawlhub.frontier import Seed, TimeSegments, segment_resolver
from crawlhub.frontier.config import FrontierConfig
from tests.helpers import FakeClock

from .conftest import DAY, T0, MakeFrontier


@pytest.mark.parametrize(("text", "seconds"), [("6h", 21600), ("1d", 86400), ("3d", 259200),
                                               ("1w", 604800), (3600, 3600)])
def test_segment_length_comes_from_a_duration(text: object, seconds: float) -> None:
    resolver = segment_resolver(FrontierConfig.model_validate({"segment": text}))
    assert isinstance(resolver, TimeSegments) and resolver.seconds == seconds


def test_segments_are_utc_spans_from_the_epoch() -> None:
    days = TimeSegments(DAY)
    s = days.segment_of(None, T0)
    assert days.start_of(s) <= T0 < days.start_of(s + 1)
    assert days.label(s) == "2023-11-14"
    assert TimeSegments(6 * 3600).label(TimeSegments(6 * 3600).segment_of(None, T0)) == (
        "2023-11-14T18:00:00Z"
    )


def test_a_future_not_before_picks_its_segment_a_past_one_does_not() -> None:
    days = TimeSegments(DAY)
    now = days.segment_of(None, T0)
    assert days.segment_of(Seed("http://a/", not_before=T0 + 3 * DAY), T0) == now + 3
    assert days.segment_of(Seed("http://a/", not_before=T0 - 3 * DAY), T0) == now


def test_a_segment_under_one_second_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1s"):
        FrontierConfig.model_validate({"segment": "500ms"})


class Campaigns:
    """A user resolver: seeds carry their campaign number in meta."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def segment_of(self, seed: Seed | None, now: float) -> int:
        if seed is not None and "campaign" in seed.meta:
            return int(seed.meta["campaign"])
        return 0

    def start_of(self, segment: int) -> float:
        return 0.0

    def label(self, segment: int) -> str:
        return f"campaign {segment}"


CAMPAIGNS = Campaigns(1)


def test_a_resolver_class_by_import_path_is_built_with_the_segment_length() -> None:
    config = FrontierConfig(segment_resolver="tests.frontier.test_segments:Campaigns")
    resolver = segment_resolver(config)
    assert isinstance(resolver, Campaigns) and resolver.seconds == DAY


def test_a_resolver_object_by_import_path_is_used_as_is() -> None:
    config = FrontierConfig(segment_resolver="tests.frontier.test_segments.CAMPAIGNS")
    assert segment_resolver(config) is CAMPAIGNS


def test_a_wrong_resolver_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="lacks segment_of"):
        segment_resolver(FrontierConfig(segment_resolver="tests.frontier.test_segments:T0x"))
    with pytest.raises(ConfigError, match="segment_resolver"):
        segment_resolver(FrontierConfig(segment_resolver="nowhere:thing"))


T0x = dict


async def test_a_frontier_dedups_within_the_segments_of_a_custom_resolver(
    make_frontier: MakeFrontier, clock: FakeClock
) -> None:
    f = await make_frontier(segment_resolver="tests.frontier.test_segments:Campaigns")
    one = [Seed("http://a.com/", meta={"campaign": 1}), Seed("http://a.com/", meta={"campaign": 1})]
    two = [Seed("http://a.com/", meta={"campaign": 2})]
    assert await f.admit(one) == [True, False]
    assert await f.admit(two) == [True]
    assert [r["label"] for r in await f.stats()] == ["campaign 1", "campaign 2"]

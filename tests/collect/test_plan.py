"""Pure planners: the request sequences of every strategy, with no I/O."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from crawlhub.collect.plan import (
    IncrementalState,
    Sweep,
    forward_done,
    forward_pages,
    incremental_requests,
    plan_incremental,
    window_segments,
)


def test_first_run_walks_back_from_total_minus_batch_until_three_expired_batches() -> None:
    # seed 000 example 1: total 257449, batch 100, no progress; items below 1049 expired
    offsets = list(range(257349, -1, -100))
    expired = iter(o < 1049 for o in offsets)
    reqs = incremental_requests(257449, IncrementalState(), 100, expired=expired)
    assert reqs[0] == (257349, 100)
    assert reqs[1] == (257249, 100)
    assert reqs[-4:] == [(1049, 100), (949, 100), (849, 100), (749, 100)]
    assert reqs == [(o, 100) for o in range(257349, 748, -100)]


def test_second_run_walks_back_to_previous_start_offset() -> None:
    # seed 000 example 2: total 257600 after a completed first run at 257449
    state = IncrementalState(covered_total=257449, last_start_offset=257349)
    assert incremental_requests(257600, state, 100) == [(257500, 100), (257400, 100)]


def test_plan_records_the_seed_start_offset_and_new_total() -> None:
    run = plan_incremental(257449, IncrementalState(), 100)
    assert run.last_start_offset == 257349
    assert run.covered_total == 257449
    assert run.sweeps == [Sweep(next=257349, floor=0, size=100, expire_stop=True)]


def test_offsets_clamp_at_zero_when_total_is_below_batch_size() -> None:
    assert incremental_requests(42, IncrementalState(), 100) == [(0, 42)]


def test_the_last_window_clamps_at_zero_instead_of_skipping_the_oldest_items() -> None:
    assert incremental_requests(250, IncrementalState(), 100) == [(150, 100), (50, 100), (0, 50)]


def test_empty_source_requests_nothing() -> None:
    assert incremental_requests(0, IncrementalState(), 100) == []


def test_no_new_items_requests_nothing() -> None:
    state = IncrementalState(covered_total=500, last_start_offset=400)
    assert incremental_requests(500, state, 100) == []


def test_a_pending_sweep_from_a_stopped_run_is_finished_after_the_new_items() -> None:
    # run 2 (floor 1000) stopped with its cursor at 1300: 1000..1399 still pending
    pending = Sweep(next=1300, floor=1000, size=100)
    state = IncrementalState(covered_total=1600, last_start_offset=1500, sweeps=[pending])
    reqs = incremental_requests(1750, state, 100)
    assert reqs == [(1650, 100), (1550, 100), (1300, 100), (1200, 100), (1100, 100), (1000, 100)]


def test_overlap_rereads_a_margin_below_the_previous_total() -> None:
    state = IncrementalState(covered_total=1000, last_start_offset=900)
    assert incremental_requests(1100, state, 100, overlap=150) == [
        (1000, 100),
        (900, 100),
        (800, 100),
    ]


def test_a_changed_batch_size_still_reaches_the_previous_total() -> None:
    state = IncrementalState(covered_total=1000, last_start_offset=900)
    assert incremental_requests(1100, state, 30) == [(1070, 30), (1040, 30), (1010, 30), (980, 30)]


def test_expiry_stops_only_the_first_run_sweep() -> None:
    state = IncrementalState(covered_total=1000, last_start_offset=900)
    reqs = incremental_requests(1500, state, 100, expired=iter([True] * 10))
    assert len(reqs) == 5


def test_expired_count_resets_on_a_batch_with_valid_items() -> None:
    pattern = iter([True, True, False, True, True, True, False])
    reqs = incremental_requests(1000, IncrementalState(), 100, expired=pattern)
    assert reqs == [(900, 100), (800, 100), (700, 100), (600, 100), (500, 100), (400, 100)]


def test_state_round_trips_through_a_dict() -> None:
    state = plan_incremental(1234, IncrementalState(), 100)
    assert IncrementalState.from_dict(state.to_dict()) == state
    assert IncrementalState.from_dict(None) == IncrementalState()


def test_bad_batch_size_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        plan_incremental(10, IncrementalState(), 0)


def test_forward_pages_stop_on_short_page_or_total() -> None:
    pages = forward_pages(100, start_page=1)
    first, second = next(pages), next(pages)
    assert (first.offset, first.limit, first.page) == (0, 100, 1)
    assert (second.offset, second.page) == (100, 2)
    assert forward_done(second, 40, None)
    assert forward_done(second, 100, 200)
    assert not forward_done(second, 100, 201)


def test_window_segments_cover_the_range_with_a_short_last_segment() -> None:
    t0 = datetime(2024, 1, 1)
    segs = window_segments(t0, t0 + timedelta(hours=2, minutes=30), timedelta(hours=1))
    assert segs == [
        (t0, t0 + timedelta(hours=1)),
        (t0 + timedelta(hours=1), t0 + timedelta(hours=2)),
        (t0 + timedelta(hours=2), t0 + timedelta(hours=2, minutes=30)),
    ]
    assert window_segments(t0, t0, timedelta(hours=1)) == []

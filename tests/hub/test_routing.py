"""Routing decisions (no I/O): which outbound takes a task, what it sends, and what a
result leads to — SPEC §1 "Results" branch by branch."""

from __future__ import annotations

from typing import Any

import pytest

from crawlhub.core.task import BUILTIN_KEYS, Task
from crawlhub.hub.config import OutboundConfig
from crawlhub.hub.routing import OutboundRule, ResultOutcome, Router, decide_result, status_key


def rule(**fields: Any) -> OutboundRule:
    fields.setdefault("name", "o")
    return OutboundRule.from_config(OutboundConfig.model_validate(fields))


def router(*rules: OutboundRule, limits: int = -1, terminal: tuple[Any, ...] = (1000, 1101)
           ) -> Router:
    return Router(rules, limits=limits, terminal_codes=terminal)


def dispatched(r: OutboundRule, **task: Any) -> Task:
    return r.stamp(Task(task).ensure_identity("crawlhub"))


CAPTCHA = rule(
    name="zongju_captcha_ts3",
    selector=["task_src in [3] and not detail_url and data_type and"
              " task_parms['province'] == 'GD'"],
    task_params=["company_name", "credit_no", "search_key", "outbound"],
    task_src=3, task_type="破码", priority=1000, rt_priority=2000, retry_limits=5,
)


def test_first_matching_outbound_in_order_takes_the_task() -> None:
    a = rule(name="a", selector=["kind == 'x'"])
    b = rule(name="b", selector=["kind in ['x', 'y']"])
    c = rule(name="c")
    r = router(a, b, c)
    assert r.route({"kind": "x"}).outbound is a
    assert r.route({"kind": "y"}).outbound is b
    assert r.route({"kind": "z"}).outbound is c


def test_disabled_outbound_is_passed_over_and_explained() -> None:
    a = rule(name="a", disable=True)
    b = rule(name="b")
    decision = router(a, b).route({}, explain=True)
    assert decision.outbound is b
    assert [(c.outbound, c.reason) for c in decision.candidates] == [
        ("a", "disabled"), ("b", "selector matched")]


def test_no_match_says_why() -> None:
    decision = router(rule(name="a", selector=["x == 1"])).route({"x": 2}, explain=True)
    assert decision.outbound is None
    assert "no outbound" in decision.reason
    assert decision.candidates[0].reason == "no selector matched"


def test_first_picks_what_route_picks_across_sets_disabled_rules_and_limits() -> None:
    rules = (rule(name="off", disable=True),
             rule(name="two", selector=["kind == 'a'", "n > 5"]),
             rule(name="bad", selector=["int(n) == 2"]),  # fails on n='x': not a match
             rule(name="all"))
    tasks: list[dict[str, Any]] = [{"kind": "a"}, {"n": 9}, {"n": 2}, {"n": "x"}, {},
                                   {"kind": "a", "routed_count": 3}]
    for limits in (-1, 3):
        r = router(*rules, limits=limits)
        for task in tasks:
            assert r.first(task) is r.route(task).outbound, (limits, task)
    assert router(*rules).first({"n": 2}) is rules[2]
    assert router(*rules, limits=3).first({"kind": "a", "routed_count": 3}) is None
    assert router(rule(name="x", selector=["n == 1"])).first({"n": 2}) is None


def test_seed_selector_routes_taskhub_task() -> None:
    task = {"task_src": 3, "data_type": "change", "task_parms": {"province": "GD"},
            "company_name": "c"}
    decision = router(CAPTCHA).route(task)
    assert decision.outbound is CAPTCHA
    assert decision.selector and "province" in decision.selector
    assert router(CAPTCHA).route({**task, "detail_url": "http://x"}).outbound is None


def test_params_hold_selected_keys_static_params_and_every_builtin_key() -> None:
    task = dispatched(CAPTCHA, company_name="c", credit_no="9143", extra="not sent",
                      rt=True)
    params = CAPTCHA.params(task)
    assert params["company_name"] == "c" and params["credit_no"] == "9143"
    assert "extra" not in params and "search_key" not in params
    assert params["task_src"] == 3 and params["task_type"] == "破码"
    assert set(BUILTIN_KEYS) <= set(params)
    assert params["outbound"] == "zongju_captcha_ts3"
    assert params["priority"] == 2000  # rt task: rt_priority
    assert params["routed_count"] == 1 and params["retry_limits"] == 5


def test_params_wrapped_under_task_params() -> None:
    r = rule(name="w", task_params_wrapped=True)
    params = r.params(dispatched(r, company_name="c"))
    assert list(params) == ["task_params"]
    assert params["task_params"]["company_name"] == "c"
    assert params["task_params"]["outbound"] == "w"


def test_params_default_to_every_user_key_without_result() -> None:
    r = rule(name="all")
    params = r.params(dispatched(r, a=1, b=[1, 2], task_result=1000))
    assert params["a"] == 1 and params["b"] == [1, 2] and "task_result" not in params


def test_params_keep_the_task_order_then_static_then_every_builtin_in_order() -> None:
    """The layout a worker reads: the task's own keys in its order (a built-in one given
    early moves to the end, the result code is never sent), the static params, then
    every built-in key in BUILTIN_KEYS order, None where the task has none."""
    r = rule(name="all", task_src=7)
    task = Task({"b": 1, "priority": 3, "a": [1], "task_result": 1000, "outbound": "x",
                 "z": None})
    params = r.params(task)
    assert list(params) == ["b", "a", "z", "task_src", *BUILTIN_KEYS]
    assert params["priority"] == 3 and params["outbound"] == "x" and params["task_src"] == 7
    assert params["task_uuid"] is None and params["submitter"] is None
    assert task == {"b": 1, "priority": 3, "a": [1], "task_result": 1000, "outbound": "x",
                    "z": None}  # (the task itself is not changed)
    # a stamped task: its own keys, the static params, then the built-ins (its own values)
    stamped = dispatched(r, b=2)
    assert list(r.params(stamped))[:2] == ["b", "task_src"]
    assert r.params(stamped)["outbound"] == "all"


def test_normal_task_uses_priority_and_rt_task_rt_priority() -> None:
    assert CAPTCHA.priority_for({"rt": False}) == 1000
    assert CAPTCHA.priority_for({"rt": True}) == 2000
    assert rule(name="p", priority=5).priority_for({"rt": True}) == 5


def test_token_scope_defaults_to_outbound_name_when_rate_set() -> None:
    assert rule(name="limited", token_per_second=5).token_scope == "limited"
    assert rule(name="shared", token_per_second=5, token_scope="*").token_scope == "*"


def test_status_codes_compare_as_text() -> None:
    assert status_key(1000) == status_key("1000") == status_key(1000.0) == "1000"


def test_terminal_code_is_success() -> None:
    a = rule(name="a")
    decision = decide_result(router(a), dispatched(a), "a", "1101")
    assert decision.outcome is ResultOutcome.SUCCESS and decision.task is None


def test_failure_retries_on_same_outbound_until_retry_limits() -> None:
    a = rule(name="a", retry_limits=2)
    r = router(a)
    task = dispatched(a, url="u")
    first = decide_result(r, task, "a", 500)
    assert first.outcome is ResultOutcome.RETRY and first.target is a
    assert first.task is not None and first.task["retry_times"] == 1
    assert first.task["group_retry_times"] == 1
    second = decide_result(r, a.stamp(first.task), "a", 500)
    assert second.outcome is ResultOutcome.RETRY and second.task is not None
    assert second.task["retry_times"] == 2
    third = decide_result(r, a.stamp(second.task), "a", 500)
    assert third.outcome is ResultOutcome.FAILED
    assert "retry_limits (2) reached" in third.reason


def test_retry_does_not_carry_the_result_code() -> None:
    a = rule(name="a")
    decision = decide_result(router(a), {**dispatched(a), "task_result": 500}, "a", 500)
    assert decision.task is not None and "task_result" not in decision.task


def test_retry_limits_reached_goes_to_failback_and_resets_retry_times() -> None:
    a = rule(name="a", retry_limits=0, failback="b", reset_retry_times=True)
    b = rule(name="b", selector=["never == 1"])
    task = dispatched(a)
    task["retry_times"] = 4
    decision = decide_result(router(a, b), task, "a", 500)
    assert decision.outcome is ResultOutcome.FAILBACK and decision.target is b
    assert decision.task is not None and decision.task["retry_times"] == 0


def test_failback_keeps_retry_times_without_reset() -> None:
    a = rule(name="a", retry_limits=1, failback="b")
    b = rule(name="b")
    task = dispatched(a)
    task["retry_times"] = 1
    decision = decide_result(router(a, b), task, "a", 500)
    assert decision.outcome is ResultOutcome.FAILBACK
    assert decision.task is not None and decision.task["retry_times"] == 1


def test_direct_failback_status_skips_retries() -> None:
    a = rule(name="a", retry_limits=5, failback="b", direct_failback_status=[403])
    b = rule(name="b")
    decision = decide_result(router(a, b), dispatched(a), "a", "403")
    assert decision.outcome is ResultOutcome.FAILBACK and decision.target is b


def test_dont_retry_status_reroutes_by_rules_skipping_failed_outbound() -> None:
    a = rule(name="a", selector=["kind == 'x'"], dont_retry_status=[404], retry_limits=5)
    b = rule(name="b", selector=["kind == 'x' and task_result == 404"])
    c = rule(name="c")
    decision = decide_result(router(a, b, c), dispatched(a, kind="x"), "a", 404)
    assert decision.outcome is ResultOutcome.REROUTE and decision.target is b
    assert decision.task is not None and "task_result" not in decision.task


def test_dont_retry_status_with_nowhere_to_go_fails() -> None:
    a = rule(name="a", dont_retry_status=[404])
    decision = decide_result(router(a), dispatched(a), "a", 404)
    assert decision.outcome is ResultOutcome.FAILED and "re-routing found nothing" in decision.reason


def test_routing_limits_cap_retries() -> None:
    a = rule(name="a", retry_limits=10)
    r = router(a, limits=2)
    task = dispatched(a)
    task["routed_count"] = 2
    decision = decide_result(r, task, "a", 500)
    assert decision.outcome is ResultOutcome.FAILED and "routing limit" in decision.reason


def test_routing_limits_refuse_new_route() -> None:
    decision = router(rule(name="a"), limits=1).route({"routed_count": 1})
    assert decision.outbound is None and "routing limit" in decision.reason


def test_result_for_outbound_no_longer_configured_fails() -> None:
    decision = decide_result(router(rule(name="a")), {"task_uuid": "x"}, "gone", 500)
    assert decision.outcome is ResultOutcome.FAILED and "no longer configured" in decision.reason


def test_failback_to_disabled_outbound_fails() -> None:
    a = rule(name="a", retry_limits=0, failback="b")
    b = rule(name="b", disable=True)
    decision = decide_result(router(a, b), dispatched(a), "a", 500)
    assert decision.outcome is ResultOutcome.FAILED and "failback 'b'" in decision.reason


@pytest.mark.parametrize("code", ["timeout", 500, "E_BUSY"])
def test_non_terminal_statuses_retry(code: Any) -> None:
    a = rule(name="a")
    assert decide_result(router(a), dispatched(a), "a", code).outcome is ResultOutcome.RETRY

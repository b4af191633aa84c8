"""Routing decisions, free of I/O: which outbound takes a task, what it sends, and what a
result leads to (terminal, retry, failback, re-route, failed).

Everything here is a pure function of the config and the task, so the HTTP dry run
(``check_task``) and the live hub share one code path.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crawlhub.core.selectors import MATCH_ALL, SelectorSet, compile_selectors
from crawlhub.core.task import BUILTIN_KEYS, RESULT_KEY, Task


def status_key(code: Any) -> str:
    """Result codes compare as text: ``1000`` and ``"1000"`` are the same status."""
    if isinstance(code, bool):
        return str(int(code))
    if isinstance(code, float) and code.is_integer():
        return str(int(code))
    return str(code).strip()


@dataclass(slots=True)
class OutboundRule:
    """The routing-relevant part of one outbound entry, compiled."""

    name: str
    selectors: SelectorSet
    task_params: tuple[str, ...] | None = None
    task_params_wrapped: bool = False
    static_params: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    rt_priority: int | None = None
    retry_limits: int = 3
    dont_retry_status: frozenset[str] = frozenset()
    direct_failback_status: frozenset[str] = frozenset()
    failback: str | None = None
    reset_retry_times: bool = False
    token_scope: str | None = None
    token_per_second: float | None = None
    max_lag: int = -1
    result_timeout: float | None = None
    frontier: str | None = None
    disabled: bool = False

    @classmethod
    def from_config(cls, cfg: Any, *, default_result_timeout: float | None = None
                    ) -> OutboundRule:
        scope = cfg.token_scope
        if cfg.token_per_second and not scope:
            scope = cfg.name
        return cls(
            name=cfg.name,
            selectors=compile_selectors(list(cfg.selector)),
            task_params=tuple(cfg.task_params) if cfg.task_params is not None else None,
            task_params_wrapped=bool(cfg.task_params_wrapped),
            static_params=dict(cfg.static_params),
            priority=int(cfg.priority),
            rt_priority=cfg.rt_priority,
            retry_limits=int(cfg.retry_limits),
            dont_retry_status=frozenset(status_key(c) for c in cfg.dont_retry_status),
            direct_failback_status=frozenset(status_key(c) for c in cfg.direct_failback_status),
            failback=cfg.failback,
            reset_retry_times=bool(cfg.reset_retry_times),
            token_scope=scope,
            token_per_second=cfg.token_per_second,
            max_lag=int(cfg.max_lag),
            result_timeout=(
                cfg.result_timeout if cfg.result_timeout is not None else default_result_timeout
            ),
            frontier=cfg.frontier,
            disabled=bool(cfg.disable),
        )

    def priority_for(self, task: Mapping[str, Any]) -> int:
        if task.get("rt") and self.rt_priority is not None:
            return self.rt_priority
        return self.priority

    def stamp(self, task: Task) -> Task:
        """Write the built-in keys this outbound owns onto a task being dispatched."""
        task["outbound"] = self.name
        task["routed_count"] = task.routed_count + 1
        task["retry_limits"] = self.retry_limits
        task["priority"] = self.priority_for(task)
        task["token_scope"] = self.token_scope
        return task

    def params(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """Exactly what this outbound sends for ``task``: the selected params, the
        static params, then every built-in key; wrapped under ``task_params`` if asked."""
        if self.task_params is None:
            # the task's own keys in its order (a C-level copy, then the few keys that
            # are not params out: 2.6x the comprehension that picked each key)
            params = dict(task)
            params.pop(RESULT_KEY, None)
            if self.static_params:
                params.update(self.static_params)
            pop, get = params.pop, task.get
            for key in BUILTIN_KEYS:  # every built-in key, in order, last
                pop(key, None)
                params[key] = get(key)
        else:
            params = {k: task[k] for k in self.task_params if k in task and k != RESULT_KEY}
            if self.static_params:
                params.update(self.static_params)
            params.update(zip(BUILTIN_KEYS, map(task.get, BUILTIN_KEYS), strict=True))
        if self.task_params_wrapped:
            return {"task_params": params}
        return params


@dataclass(slots=True)
class Candidate:
    """How one outbound judged a task (for the dry run's 'why not')."""

    outbound: str
    matched: bool
    reason: str


@dataclass(slots=True)
class RouteDecision:
    outbound: OutboundRule | None
    selector: str | None
    reason: str
    candidates: list[Candidate] = field(default_factory=list)


class Router:
    """The ordered outbound rules: the first enabled outbound whose selectors match wins."""

    def __init__(self, rules: Sequence[OutboundRule], *, limits: int = -1,
                 terminal_codes: Collection[Any] = (1000,)) -> None:
        self.rules = list(rules)
        self.by_name = {r.name: r for r in self.rules}
        self.limits = limits
        self.terminal = frozenset(status_key(c) for c in terminal_codes)
        # Every selector of every enabled rule, in routing order, with its rule: the
        # first that matches routes the task (an empty set matches all: MATCH_ALL).
        self._chain: tuple[tuple[Callable[[Mapping[str, Any]], bool], OutboundRule], ...] = \
            tuple((matcher, rule) for rule in self.rules if not rule.disabled
                  for matcher in (rule.selectors.matchers or (MATCH_ALL,)))

    def first(self, task: Mapping[str, Any]) -> OutboundRule | None:
        """The outbound :meth:`route` picks for ``task`` (no skip), or None: the hot
        path of intake, one call per selector tried (``route`` says why not)."""
        if self.limits >= 0 and _int(task.get("routed_count")) >= self.limits:
            return None
        for matcher, rule in self._chain:
            if matcher(task):
                return rule
        return None

    def route(self, task: Mapping[str, Any], *, skip: Collection[str] = (),
              explain: bool = False) -> RouteDecision:
        candidates: list[Candidate] = []
        routed = _int(task.get("routed_count"))
        if self.limits >= 0 and routed >= self.limits:
            return RouteDecision(None, None, f"routing limit reached: routed {routed} times,"
                                 f" routing.limits is {self.limits}")
        for rule in self.rules:
            if rule.disabled:
                if explain:
                    candidates.append(Candidate(rule.name, False, "disabled"))
                continue
            if rule.name in skip:
                if explain:
                    candidates.append(Candidate(rule.name, False, "skipped: it failed this task"))
                continue
            selector = rule.selectors.match(task)
            if selector is not None:
                if explain:
                    candidates.append(Candidate(rule.name, True, "selector matched"))
                text = selector.text if rule.selectors.texts else None
                return RouteDecision(rule, text, "matched", candidates)
            if explain:
                candidates.append(Candidate(rule.name, False, "no selector matched"))
        reason = "no outbound's selector matched the task"
        if skip:
            reason += f" (skipping {', '.join(sorted(skip))})"
        return RouteDecision(None, None, reason, candidates)


class ResultOutcome(enum.StrEnum):
    SUCCESS = "success"
    RETRY = "retry"
    FAILBACK = "failback"
    REROUTE = "reroute"
    FAILED = "failed"


@dataclass(slots=True)
class ResultDecision:
    """What a result does: ``task`` is the task to dispatch again (RETRY, FAILBACK,
    REROUTE) to ``target``; ``reason`` says why in words."""

    outcome: ResultOutcome
    reason: str
    task: Task | None = None
    target: OutboundRule | None = None
    selector: str | None = None


def decide_result(router: Router, dispatched: Mapping[str, Any], outbound: str,
                  code: Any) -> ResultDecision:
    """SPEC §1 "Results", in order: terminal -> direct_failback -> dont_retry (re-route,
    skipping the failed outbound) -> retry on the same outbound -> failback -> failed."""
    status = status_key(code)
    if status in router.terminal:
        return ResultDecision(ResultOutcome.SUCCESS, f"status {status} is a terminal code")
    rule = router.by_name.get(outbound)
    task = Task({k: v for k, v in dispatched.items() if k != RESULT_KEY})
    if rule is None:
        return ResultDecision(ResultOutcome.FAILED, f"status {status}: outbound {outbound!r} is no"
                              " longer configured")
    if status in rule.direct_failback_status and rule.failback:
        return _failback(router, rule, task, f"status {status} is in direct_failback_status")
    if status in rule.dont_retry_status:
        probe = Task(task)
        probe[RESULT_KEY] = code
        decision = router.route(probe, skip={rule.name})
        if decision.outbound is None:
            return ResultDecision(ResultOutcome.FAILED, f"status {status} is in dont_retry_status"
                                  f" and re-routing found nothing: {decision.reason}")
        return ResultDecision(ResultOutcome.REROUTE, f"status {status} is in dont_retry_status:"
                              f" re-routed to {decision.outbound.name}", task,
                              decision.outbound, decision.selector)
    if task.retry_times < rule.retry_limits:
        limit_reason = _limit_reason(router, task)
        if limit_reason:
            return ResultDecision(ResultOutcome.FAILED, f"status {status}: {limit_reason}")
        task["retry_times"] = task.retry_times + 1
        task["group_retry_times"] = _int(task.get("group_retry_times")) + 1
        return ResultDecision(ResultOutcome.RETRY, f"status {status}: retry {task['retry_times']}"
                              f" of {rule.retry_limits} on {rule.name}", task, rule)
    if rule.failback:
        return _failback(router, rule, task, f"status {status}: retry_limits"
                         f" ({rule.retry_limits}) reached")
    return ResultDecision(ResultOutcome.FAILED, f"status {status}: retry_limits ({rule.retry_limits})"
                          f" reached on {rule.name} and no failback")


def _failback(router: Router, rule: OutboundRule, task: Task, why: str) -> ResultDecision:
    target = router.by_name.get(rule.failback or "")
    if target is None or target.disabled:
        return ResultDecision(ResultOutcome.FAILED, f"{why}; failback {rule.failback!r} is not an"
                              " enabled outbound")
    limit_reason = _limit_reason(router, task)
    if limit_reason:
        return ResultDecision(ResultOutcome.FAILED, f"{why}; {limit_reason}")
    task["group_retry_times"] = _int(task.get("group_retry_times")) + 1
    if rule.reset_retry_times:
        task["retry_times"] = 0
    return ResultDecision(ResultOutcome.FAILBACK, f"{why}: failback to {target.name}", task, target)


def _limit_reason(router: Router, task: Mapping[str, Any]) -> str:
    routed = _int(task.get("routed_count"))
    if router.limits >= 0 and routed >= router.limits:
        return f"routing limit reached: routed {routed} times, routing.limits is {router.limits}"
    return ""


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0

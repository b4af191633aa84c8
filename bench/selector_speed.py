"""Selector speed: crawlhub's compiled selectors against simpleeval on the seed's rules.

Run: /work/venv/bin/python bench/selector_speed.py [seconds-per-measurement]
"""

from __future__ import annotations

import sys
import timeit
from typing import Any

from rich.console import Console
from rich.table import Table
from simpleeval import EvalWithCompoundTypes

from crawlhub.core.selectors import ALLOWED_FUNCTIONS, compile_selector

#: A realistic task (taskHUB seed 004) on which every selector below evaluates all clauses.
TASK: dict[str, Any] = {
    "task_uuid": "5f0c8a6e2b7d4e8f9a1b2c3d4e5f6a7b",
    "submitter": "taskhub",
    "submit_time": "2024-05-01 10:00:00",
    "company_name": "",
    "credit_no": "91440300MA5EXAMPLE",
    "company_code": "",
    "task_src": 3,
    "detail_url": "",
    "data_type": "change",
    "task_type": "找新",
    "province": "TJ",
    "task_result": 1000,
    "retry_times": 0,
    "task_parms": {"province": "GD", "search_key": "ACME"},
}

#: Representative selectors: the seed's own rules.
EXPRESSIONS: list[str] = [
    "int(task_src) in [1, 3] and not detail_url",
    "task_parms['province'] == 'GD'",
    "submitter == 'taskhub' and (company_name or credit_no or company_code) "
    "and int(task_src) in [1, 11, 5, 3, 22, 21, 7]",
    "task_type == '找新' and province in ['JS', 'TJ', 'ZJ'] and task_result == 1000 "
    "and task_src == 3",
    "task_src in [3] and not detail_url and data_type and task_parms['province'] == 'GD'",
]


def _rate(stmt: str, namespace: dict[str, Any], seconds: float) -> float:
    """Executions per second of ``stmt`` over at least ``seconds``.

    ``timeit`` compiles the loop around ``stmt``, so neither side pays for an extra
    Python call per evaluation.
    """
    timer = timeit.Timer(stmt, globals=namespace)
    number = 10_000
    calls = 0
    elapsed = 0.0
    while elapsed < seconds:
        elapsed += timer.timeit(number)
        calls += number
    return calls / elapsed


def measure(seconds: float = 1.0) -> list[dict[str, Any]]:
    """One row per expression: evaluations per second for crawlhub and simpleeval.

    Rows: ``{expression, crawlhub_per_s, simpleeval_per_s, ratio}`` where ratio is
    crawlhub / simpleeval.  simpleeval gets its fairest setup: ``EvalWithCompoundTypes``
    (for list literals), the same functions, names bound to the task, parsed once.
    Both evaluators must agree on every expression.
    """
    rows = []
    for expression in EXPRESSIONS:
        selector = compile_selector(expression)
        evaluator = EvalWithCompoundTypes(functions=dict(ALLOWED_FUNCTIONS), names=TASK)
        parsed = evaluator.parse(expression)
        if selector(TASK) is not bool(evaluator.eval(expression, previously_parsed=parsed)):
            raise AssertionError(f"crawlhub and simpleeval disagree on {expression!r}")
        namespace = {
            "selector": selector,
            "task": TASK,
            "evaluator": evaluator,
            "expression": expression,
            "parsed": parsed,
        }
        ours = _rate("selector(task)", namespace, seconds)
        theirs = _rate(
            "bool(evaluator.eval(expression, previously_parsed=parsed))", namespace, seconds
        )
        rows.append(
            {
                "expression": expression,
                "crawlhub_per_s": ours,
                "simpleeval_per_s": theirs,
                "ratio": ours / theirs,
            }
        )
    return rows


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    table = Table(title=f"Selector evaluations per second ({seconds:g} s per cell)")
    table.add_column("expression", overflow="fold", max_width=60)
    table.add_column("crawlhub /s", justify="right")
    table.add_column("simpleeval /s", justify="right")
    table.add_column("ratio", justify="right")
    for row in measure(seconds):
        table.add_row(
            row["expression"],
            f"{row['crawlhub_per_s']:,.0f}",
            f"{row['simpleeval_per_s']:,.0f}",
            f"{row['ratio']:.1f}x",
        )
    Console().print(table)


if __name__ == "__main__":
    main()

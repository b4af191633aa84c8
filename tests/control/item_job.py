"""A job for the jobs API and web page tests, run as a real process: counts ``argv[1]``
items, one every ``argv[2]`` seconds (0.05), in tasks of 10 (``step-0``, ``step-1``...),
each item a log line ``item <n> counted`` of its task and the counters ``success`` and
``total``; holds still while paused, ends cleanly when exit is asked, its counters
flushed. (``counting_job.py`` is the SDK tests' job: one task, counting until exit.)"""

from __future__ import annotations

import sys
import time

from crawlhub import sdk


def main(items: int, every: float) -> None:
    n = 0
    while n < items:
        if not sdk.control().wait_while_paused():
            break
        with sdk.task(f"step-{n // 10}"):
            n += 1
            sdk.set_counters({"success": n, "total": items})
            sdk.log(f"item {n} counted")
            time.sleep(every)
    sdk.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.05)

"""A hub process for the result-path crash tests: handles results, or sweeps, and kills
itself with SIGKILL at a named point when ``CRAWLHUB_TEST_KILL_AT`` says so.

    python -m tests.hub.result_child CONFIG_JSON CLOCK results RESULTS_JSON
    python -m tests.hub.result_child CONFIG_JSON CLOCK sweep

``CLOCK`` is the hub's clock (epoch seconds, fixed). ``CRAWLHUB_TEST_KILL_AT`` is
``<point>:<n>``: die right after the n-th time the point is passed. Points: ``settle``
(a settle that applied returned: committed), ``push`` (a follow-up push returned),
``failure`` (a failure line was written), ``claim`` (a sweep claimed entries).
Prints one JSON outcome per handled result.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.services import Services


class Killer:
    def __init__(self, spec: str) -> None:
        point, _, n = spec.partition(":")
        self.point, self.n, self.seen = point, int(n or 1), 0

    def passed(self, point: str) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen == self.n:
            os.kill(os.getpid(), signal.SIGKILL)

    def after(self, point: str, fn: Callable[..., Any],
              applies: Callable[[Any], int] = lambda _: 1) -> Callable[..., Any]:
        """``fn`` passing ``point`` ``applies(result)`` times each call (once by
        default; a batch settle passes it once per entry it applied)."""
        @wraps(fn)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = await fn(*args, **kwargs)
            for _ in range(int(applies(result))):
                self.passed(point)
            return result

        return wrapped


async def main(config: str, clock: float, mode: str, results: str | None) -> None:
    cfg = CrawlhubConfig.model_validate(json.loads(Path(config).read_text()))
    svc = await Services.open(cfg)
    hub = svc.hub
    hub.clock = lambda: clock
    killer = Killer(os.environ.get("CRAWLHUB_TEST_KILL_AT", "none:0"))
    state: Any = hub.state
    # settle() goes through settle_many() on both backends: every applied settle, of
    # one entry or of a batch, passes the point once
    state.settle_many = killer.after("settle", state.settle_many, sum)
    state.claim_expired = killer.after("claim", state.claim_expired, bool)
    hub._send = killer.after("push", hub._send)  # type: ignore[method-assign]
    failures: Any = hub.failures
    failures.append = killer.after("failure", failures.append)
    try:
        if mode == "sweep":
            await hub.sweep_lost()
        else:
            for result in json.loads(Path(results or "").read_text()):
                [outcome] = await hub.receive("http", [result])
                print(json.dumps(outcome), flush=True)
    finally:
        await svc.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], float(args[1]), args[2], args[3] if len(args) > 3 else None))

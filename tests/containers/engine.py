"""Helpers of the container tests, reusable by others (agents in containers, the
walkthrough): the log sink, the engine's view of crawlhub's containers, a job's script
written into its run's reach."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from crawlhub.control.jobs.container import LABEL_RUN
from crawlhub.control.logs.line import LogLine
from tests.containers.baseimage import ENGINE


class Sink:
    """The lines a runner writes (the log store's input)."""

    def __init__(self) -> None:
        self.lines: list[LogLine] = []

    async def __call__(self, batch: list[LogLine]) -> None:
        self.lines.extend(batch)

    def text(self, run: str | None = None, stream: str | None = None) -> list[str]:
        return [line.message for line in self.lines
                if (run is None or line.run == run) and (stream is None or line.stream == stream)]


def containers_of(run: str) -> list[dict[str, Any]]:
    """The engine's containers (any state) labelled with ``run``."""
    out = subprocess.run([ENGINE, "ps", "-a", "--filter", f"label={LABEL_RUN}={run}",
                          "--format", "json"], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout or "[]") or [])


def state_of(run: str) -> str | None:
    found = containers_of(run)
    return str(found[0]["State"]).lower() if found else None


def py(code: str) -> list[str]:
    """The argv that runs ``code`` with the image's Python."""
    return ["python3", "-c", code]

"""One log line of the control plane's searchable store (seed 002: every line carries the
job, run and task codes where known)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Levels, lowest first; a search for ``level=warning`` finds warning, error and critical.
LEVELS = ("debug", "info", "warning", "error", "critical")

#: Where a line comes from.
SOURCES = ("job", "build", "hub", "agent", "collector", "center", "control")


@dataclass(slots=True)
class LogLine:
    """A line: when, how severe, from where, what; ``id`` is given by the store."""

    ts: float
    message: str
    level: str = "info"
    source: str = "job"
    job: str | None = None
    run: str | None = None
    task: str | None = None
    host: str = ""
    stream: str | None = None  # "stdout" / "stderr" for a job's output
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def level_rank(level: str) -> int:
    """0 for debug ... 4 for critical; unknown levels rank as info."""
    try:
        return LEVELS.index(level.lower())
    except ValueError:
        return 1

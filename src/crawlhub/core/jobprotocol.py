"""What a job process and its runner say to each other, without a network.

The runner starts a job with these environment variables:

- ``CRAWLHUB_JOB``, ``CRAWLHUB_RUN``: the job's name and the run's code;
- ``CRAWLHUB_RUNNER_PID``: the pid of the server that started it (its parent while that
  server lives: a restarted server stops the job processes a killed one left behind);
- ``CRAWLHUB_CONTROL_FILE``: a JSON file ``{"state": "run"|"pause"|"exit", "changed_at":
  <unix time>}`` the runner rewrites (atomically: write + rename) when the job's desired
  state changes; the job reads it (``crawlhub.sdk.control()``);
- ``CRAWLHUB_COUNTERS_FILE``: a JSON file ``{"counters": {name: number}, "updated_at":
  <unix time>}`` the job rewrites (atomically) as it counts; the runner reads it.
- ``CRAWLHUB_ACK_FILE``: a JSON file ``{"state": "pause", "changed_at": <the control
  file's changed_at it answers>, "at": <unix time>}`` the job writes (atomically) once it
  holds still for a pause (``crawlhub.sdk`` does it in ``wait_while_paused``). A job that
  does not acknowledge a pause within :data:`ACK_WAIT` seconds is stopped with SIGSTOP
  (SIGCONT on continue): "paused" always means its processes stopped producing.

On stdout, a line that is a JSON object with a ``"crawlhub"`` key is a message to the
runner, anything else is a plain log line:

- ``{"crawlhub": "log", "level": "info", "task": "t-1" | null, "message": "..."}``
- ``{"crawlhub": "task", "task": "t-1", "status": "running" | "succeeded" | "failed",
  "ts": <unix time>, "detail": "..."}``: the run's timeline.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_JOB = "CRAWLHUB_JOB"
ENV_RUN = "CRAWLHUB_RUN"
ENV_CONTROL_FILE = "CRAWLHUB_CONTROL_FILE"
ENV_COUNTERS_FILE = "CRAWLHUB_COUNTERS_FILE"
ENV_RUNNER_PID = "CRAWLHUB_RUNNER_PID"
ENV_ACK_FILE = "CRAWLHUB_ACK_FILE"

#: Seconds a runner waits for a job to acknowledge a pause before it stops the job's
#: processes (SIGSTOP).
ACK_WAIT = 1.0

#: Desired states of a job: run, pause (hold still, lose nothing), exit (stop cleanly).
RUN, PAUSE, EXIT = "run", "pause", "exit"
STATES = (RUN, PAUSE, EXIT)

#: Statuses of a task in a run's timeline.
TASK_STATUSES = ("running", "succeeded", "failed")

_LEVEL_WORD = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
_LEVEL_OF = {"DEBUG": "debug", "INFO": "info", "WARNING": "warning", "WARN": "warning",
             "ERROR": "error", "CRITICAL": "critical", "FATAL": "critical"}


@dataclass(slots=True)
class LogMessage:
    message: str
    level: str = "info"
    task: str | None = None


@dataclass(slots=True)
class TaskEvent:
    task: str
    status: str
    ts: float
    detail: str = ""


def parse_line(text: str) -> LogMessage | TaskEvent:
    """What one stdout/stderr line of a job says: a task event or a log message.

    Plain text gets its level from a level word near its start (``ERROR``, ``WARNING``,
    ... as Python's logging and most tools print them), else ``info``.
    """
    line = text.rstrip("\r\n")
    if line.startswith("{") and '"crawlhub"' in line:
        try:
            data = json.loads(line)
        except ValueError:
            data = None
        if isinstance(data, dict):
            kind = data.get("crawlhub")
            task = data.get("task")
            task = str(task)[:200] if task not in (None, "") else None
            if kind == "task" and task and data.get("status") in TASK_STATUSES:
                ts = data.get("ts")
                return TaskEvent(task, str(data["status"]),
                                 float(ts) if isinstance(ts, int | float) else time.time(),
                                 str(data.get("detail") or "")[:2000])
            if kind == "log":
                level = str(data.get("level") or "info").lower()
                level = _LEVEL_OF.get(level.upper(), "info")
                return LogMessage(str(data.get("message", "")), level, task)
    match = _LEVEL_WORD.search(line[:80])
    return LogMessage(line, _LEVEL_OF[match.group(1)] if match else "info")


_TRACEBACK_START = ("Traceback (most recent call last):",
                    "Exception Group Traceback (most recent call last):")
_TRACEBACK_LINK = ("During handling of the above exception, another exception occurred:",
                   "The above exception was the direct cause of the following exception:")


class TracebackLevel:
    """Follows one output stream line by line: the lines of a Python traceback (its
    ``Traceback (most recent call last):`` line, the indented frames, the chaining notes
    and the exception line that ends it) are errors, though no level word is in them."""

    __slots__ = ("inside",)

    def __init__(self) -> None:
        self.inside = False

    def error(self, line: str) -> bool:
        """Whether ``line`` belongs to a traceback (a call per line, in order)."""
        bare = line.lstrip(" +|")
        if bare.startswith(_TRACEBACK_START + _TRACEBACK_LINK):
            self.inside = True
            return True
        if not self.inside:
            return False
        if not line.strip() or line[0] in " \t+|":
            return True
        self.inside = False  # the exception line: "ValueError: boom"
        return True


def write_json_atomic(path: str | Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` so a reader never sees half a file."""
    target = Path(path)
    # per process and thread: two writers never share a half-written temporary file
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(value), encoding="utf-8")
    os.replace(tmp, target)


def read_json(path: str | Path, *, max_bytes: int | None = None) -> Any:
    """The JSON in ``path``, or None when it is missing, not (yet) valid, or longer than
    ``max_bytes`` (then not read past that)."""
    try:
        with Path(path).open("rb") as file:
            data = file.read() if max_bytes is None else file.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            return None
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None

"""Per-job logs: every line is a structured dict carrying the job code, kept in a ring buffer.

A job's lines stay together in its own buffer (readable per job by code in this process)
and are also passed to the standard ``logging`` tree, prefixed with the job code, and to
subscribers (``subscribe``): collection runs ship them to the metadata store, where the
API reads them whichever process ran the job (``crawlhub.collect.logship``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from crawlhub.core.redact import redact

_std = logging.getLogger("crawlhub.job")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


class JobLog:
    """The log of one job: ``info/warning/error(event, **fields)`` and ``lines(n)``.

    A line is ``{"ts", "level", "job", "event", **fields}``; appends are atomic under a
    lock, so lines from worker threads never interleave inside a line.
    """

    def __init__(self, job_code: str, *, maxlen: int = 5000, logger: logging.Logger | None = None):
        self.job_code = job_code
        self._lines: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._logger = logger or _std
        self._subscribers: tuple[Callable[[dict[str, Any]], None], ...] = ()
        self.dropped = 0  # lines pushed out of the ring buffer

    def log(self, level: str, event: str, **fields: Any) -> dict[str, Any]:
        line: dict[str, Any] = {"ts": time.time(), "level": level, "job": self.job_code,
                                "event": event, **redact(fields)}  # kept, shipped, shown
        with self._lock:
            if self._lines.maxlen is not None and len(self._lines) == self._lines.maxlen:
                self.dropped += 1
            self._lines.append(line)
            subscribers = self._subscribers
        for subscriber in subscribers:
            subscriber(line)
        std_level = _LEVELS.get(level, logging.INFO)
        if self._logger.isEnabledFor(std_level):
            # The logging handler adds time and level: the message is "[job] event k=v".
            self._logger.log(std_level, "%s", format_line(line, stamp=False),
                             extra={"job": self.job_code})
        return line

    def subscribe(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``callback(line)`` for every new line (from the logging thread: it must be
        quick and thread-safe); returns the function that unsubscribes it."""
        with self._lock:
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not callback)

        return unsubscribe

    def debug(self, event: str, **fields: Any) -> dict[str, Any]:
        return self.log("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> dict[str, Any]:
        return self.log("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> dict[str, Any]:
        return self.log("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> dict[str, Any]:
        return self.log("error", event, **fields)

    def lines(self, n: int | None = None, *, level: str | None = None,
              event: str | None = None) -> list[dict[str, Any]]:
        """The last ``n`` lines (all when None), oldest first, optionally filtered."""
        with self._lock:
            out = list(self._lines)
        if level is not None:
            out = [line for line in out if line["level"] == level]
        if event is not None:
            out = [line for line in out if line["event"] == event]
        return out[-n:] if n is not None else out

    def text(self, n: int | None = None) -> str:
        return "\n".join(format_line(line) for line in self.lines(n))


def format_line(line: dict[str, Any], *, stamp: bool = True) -> str:
    """``HH:MM:SS LEVEL [job] event key=value ...`` (without time and level when
    ``stamp`` is false): one line of text, for consoles and files."""
    extra = " ".join(
        f"{k}={v}" for k, v in line.items() if k not in ("ts", "level", "job", "event")
    )
    text = f"[{line['job']}] {line['event']}"
    if stamp:
        clock = time.strftime("%H:%M:%S", time.localtime(line["ts"]))
        text = f"{clock} {line['level'].upper():7} {text}"
    return f"{text} {extra}" if extra else text


class JobLogs:
    """The registry of job logs in this process, so any job's log can be read by code."""

    def __init__(self, maxlen: int = 5000) -> None:
        self._logs: dict[str, JobLog] = {}
        self._lock = threading.Lock()
        self.maxlen = maxlen

    def get(self, job_code: str) -> JobLog:
        """The log of ``job_code``, created on first use."""
        with self._lock:
            log = self._logs.get(job_code)
            if log is None:
                log = self._logs[job_code] = JobLog(job_code, maxlen=self.maxlen)
            return log

    def find(self, job_code: str) -> JobLog | None:
        with self._lock:
            return self._logs.get(job_code)

    def jobs(self) -> list[str]:
        with self._lock:
            return list(self._logs)

    def drop(self, job_code: str) -> None:
        with self._lock:
            self._logs.pop(job_code, None)


#: The process-wide registry; ``job_log("j1")`` is the usual way in.
job_logs = JobLogs()


def job_log(job_code: str) -> JobLog:
    return job_logs.get(job_code)

"""A ``logging.Handler`` that ships the records of ``crawlhub.*`` loggers (hub, agents,
collectors, the center, the control plane) to the log store through the transport.

It never blocks (the transport's buffer takes the line and returns), never raises into
the code that logs, and never recurses: a record logged while shipping another (by the
transport, the Redis client, a filter) in the same thread is not shipped. Secrets are
masked first (:class:`~crawlhub.core.redact.SecretFilter`).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from crawlhub.control.logs.line import LogLine
from crawlhub.control.logs.text import clean_line, normal_level
from crawlhub.core.redact import SecretFilter

#: Logger name prefixes and the source their lines get; the first match wins.
SOURCE_OF_LOGGER: tuple[tuple[str, str], ...] = (
    ("crawlhub.agents", "agent"), ("crawlhub.fetch", "agent"),
    ("crawlhub.collect", "collector"), ("crawlhub.job", "collector"),
    ("crawlhub.center", "center"), ("crawlhub.contrib.scrapy.center", "center"),
    ("crawlhub.control", "control"),
)
_FORMATTER = logging.Formatter()


def source_of(logger_name: str) -> str:
    """``crawlhub.agents.agent`` -> ``agent``; any other ``crawlhub.*`` logger ->
    ``hub``."""
    for prefix, source in SOURCE_OF_LOGGER:
        if logger_name == prefix or logger_name.startswith(prefix + "."):
            return source
    return "hub"


def _code(record: logging.LogRecord, *names: str) -> str | None:
    for name in names:
        value = getattr(record, name, None)
        if value is not None and value != "":
            return str(value)
    return None


def record_line(record: logging.LogRecord, host: str) -> LogLine:
    """The log line of ``record``: its message (and traceback), level, the source of its
    logger, and the ``job`` / ``run`` / ``task`` of its ``extra`` when present
    (``task_uuid`` counts as the task)."""
    message = record.getMessage()
    if record.exc_info and not record.exc_text:
        record.exc_text = _FORMATTER.formatException(record.exc_info)
    if record.exc_text:
        message = f"{message}\n{record.exc_text}"
    if record.stack_info:
        message = f"{message}\n{record.stack_info}"
    return clean_line(LogLine(
        ts=record.created, message=message, level=normal_level(record.levelname),
        source=source_of(record.name), job=_code(record, "job"), run=_code(record, "run"),
        task=_code(record, "task", "task_uuid"), host=host))


class LogShipper(logging.Handler):
    """Ships records through ``put`` (a transport's ``put``); ``shipped`` and ``failed``
    count them (a failure is a bug in a record, e.g. a bad format string)."""

    def __init__(self, put: Callable[[list[LogLine]], None], *,
                 level: int = logging.NOTSET, host: str | None = None) -> None:
        super().__init__(level)
        self.addFilter(SecretFilter())
        self._put = put
        self._host = host or socket.gethostname()
        self._busy = threading.local()
        self.shipped = 0
        self.failed = 0

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        if getattr(self._busy, "on", False):  # logged while shipping: would recurse
            return False
        self._busy.on = True
        try:
            return bool(super().handle(record))
        finally:
            self._busy.on = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._put([record_line(record, self._host)])
            self.shipped += 1
        except Exception:  # noqa: BLE001 - logging must never fail the caller
            self.failed += 1


def install(put: Callable[[list[LogLine]], None], *, logger: str = "crawlhub",
            level: int = logging.NOTSET) -> LogShipper:
    """Add a :class:`LogShipper` to ``logger`` (default: every ``crawlhub.*`` logger);
    remove it with :func:`uninstall`."""
    handler = LogShipper(put, level=level)
    logging.getLogger(logger).addHandler(handler)
    return handler


def uninstall(handler: LogShipper, *, logger: str = "crawlhub") -> None:
    logging.getLogger(logger).removeHandler(handler)
    handler.close()

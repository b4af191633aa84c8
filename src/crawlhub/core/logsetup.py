"""Logging set-up from the config's ``logging`` section: console or JSON lines."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from crawlhub.core.redact import SecretFilter


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any ``extra`` fields."""

    _skip = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in self._skip and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


def setup_logging(level: str = "INFO", fmt: str = "console", file: str | None = None) -> None:
    handler: logging.Handler = (logging.FileHandler(file, encoding="utf-8") if file
                                else logging.StreamHandler(sys.stderr))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(SecretFilter())  # passwords, tokens, signs: never in a log line
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())

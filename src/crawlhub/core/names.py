"""Names users give things (jobs, projects, queues, alert routes): the one check, with each
kind's own rule, exception and message passed in by the kind's owner."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


def check_name(name: Any, pattern: re.Pattern[str], error: Callable[[Any], Exception]) -> str:
    """``name`` when it is a str that ``pattern`` matches from its start (``pattern.match``:
    anchor the pattern), else raises ``error(name)`` - the caller's exception, whose
    message names the input and the rule."""
    if not isinstance(name, str) or not pattern.match(name):
        raise error(name)
    return name

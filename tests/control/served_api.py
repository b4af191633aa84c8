"""One JSON call to a ``crawlhub serve`` started by ``tests.cli.serving``: the tests that
kill a server mid-run or mid-build drive its API with it."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from tests.cli.serving import Served


def call(served: Served, method: str, path: str, body: Any = None) -> Any:
    """``method path`` on ``served`` with ``body`` as JSON; the answer's JSON (None: empty)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{served.url}{path}", data=data, method=method,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")

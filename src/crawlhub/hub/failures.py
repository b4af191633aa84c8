"""The failure file: tasks that ended failed, one JSON object per line (gzip if asked).

Appending gzip members to one file keeps it a valid gzip stream (``zcat`` reads all).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class FailureLog:
    def __init__(self, path: str | Path, *, compress: bool = False) -> None:
        path = Path(path)
        if compress and path.suffix != ".gz":
            path = path.with_name(path.name + ".gz")
        self.path = path
        self.compress = compress
        self._lock = asyncio.Lock()

    async def append(self, records: Sequence[dict[str, Any]]) -> None:
        if not records:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        lines = "".join(
            json.dumps({"failed_at": stamp, **r}, ensure_ascii=False, default=str) + "\n"
            for r in records
        ).encode()
        async with self._lock:
            await asyncio.to_thread(self._write, lines)

    def _write(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.compress:
            import gzip  # here: a server start need not load it (about 10 ms)

            with gzip.open(self.path, "ab") as fh:
                fh.write(data)
        else:
            with open(self.path, "ab") as fh:
                fh.write(data)

    def read(self) -> list[dict[str, Any]]:
        """Every record written so far (tests, ``crawlhub`` tooling)."""
        if not self.path.exists():
            return []
        import gzip

        opener = gzip.open if self.compress else open
        with opener(self.path, "rt", encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

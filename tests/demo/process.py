"""``crawlhub demo`` as a real subprocess on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.cli.serving import crawlhub_command
from tests.servers import free_port


@contextmanager
def demo_process(*args: str, log: Path, timeout: float = 30.0) -> Iterator[str]:
    """Start ``crawlhub demo --port P ARGS``; yield its base URL once /healthz answers."""
    port = free_port()
    with open(log, "ab") as sink:
        proc = subprocess.Popen([*crawlhub_command(), "demo", "--port", str(port), *args],
                                stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"crawlhub demo exited with {proc.returncode}:\n"
                                   f"{log.read_text(errors='replace')}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"crawlhub demo did not answer within {timeout} s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)

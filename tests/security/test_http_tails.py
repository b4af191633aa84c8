"""Live log tails are capped: past ``server.max_tails_per_client`` from one address, or
``server.max_tails`` in all, a new ``GET /logs/tail`` is 429 with ``Retry-After`` until
one closes; a closed tail gives its place back."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.helpers import WAIT

from .http_live import config, live


@contextmanager
def tail(url: str, *, source: str = "127.0.0.1") -> Iterator[tuple[int, bytes]]:
    """Open ``GET /logs/tail`` from ``source``: its status and what came first; the
    stream stays open until the block ends."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30,
                                  source_address=(source, 0)) as sock:
        sock.sendall(f"GET /logs/tail?q=a*+b* HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            if not chunk:
                break
            head += chunk
        status = int(head.split(b" ", 2)[1])
        if status != 200:  # a refusal: read its JSON body too
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            while len(head.partition(b"\r\n\r\n")[2]) < length:
                head += sock.recv(65536)
        yield status, head


def test_tails_past_the_caps_are_429_and_a_closed_one_gives_its_place_back(
        tmp_path: Path) -> None:
    cfg = config(tmp_path, max_tails_per_client=2, max_tails=3)
    with live(cfg) as (url, app), ExitStack() as open_tails:
        for _ in range(2):
            status, _ = open_tails.enter_context(tail(url))
            assert status == 200
        with tail(url) as (status, head):
            assert status == 429
            assert b"Retry-After: 5" in head.replace(b"retry-after", b"Retry-After")
            assert b"max_tails_per_client" in head
        other = open_tails.enter_context(tail(url, source="127.0.0.2"))
        assert other[0] == 200
        with tail(url, source="127.0.0.3") as (status, head):
            assert status == 429 and b"server.max_tails" in head
        open_tails.close()  # every tail closes: the server sees them go
        deadline = time.monotonic() + WAIT  # (wait_for's bound; the server is a thread)
        while app.state.tails.count() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.state.tails.count() == 0, "closed tails were not given back"
        with tail(url, source="127.0.0.3") as (status, _):
            assert status == 200

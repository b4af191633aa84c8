"""Request bodies: text that is not UTF-8 (UTF-8-encoded surrogates included) is a 400 on
every JSON route; a body that arrives too slowly is cut off with 408 after
``server.body_timeout`` and its connection closed; a body over ``server.max_body_bytes``
is a 413 on model routes too."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from tests.api.conftest import MakeApi
from tests.api.live import HTTP_IMPLEMENTATIONS, serve

#: Every route that reads a JSON body, with a body it would accept.
JSON_ROUTES = [
    ("/task/", {"url": "https://example.com/", "note": "x"}),
    ("/inbound/http/", {"url": "https://example.com/", "note": "x"}),
    ("/inbound/http/check_task/", {"url": "https://example.com/", "note": "x"}),
    ("/queues/default/lease", {"n": 1, "note": "x"}),
    ("/queues/default/ack", {"ids": ["x"]}),
    ("/queues/default/nack", {"ids": ["x"]}),
]

#: Bytes that are not UTF-8, put inside a JSON string: a UTF-8-encoded lone surrogate
#: (which json.loads on bytes lets through), a stray continuation byte, Latin-1 text,
#: a truncated sequence.
BAD_TEXT = [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\x80", b"caf\xe9", b"\xf0\x9f\x98"]


def with_bad_text(body: dict[str, object], bad: bytes) -> bytes:
    text = json.dumps(body).encode()
    key = b'"note": "x"' if b'"note"' in text else b'"x"'
    return text.replace(key, key[:-2] + bad + b'"', 1) if key in text else text


@pytest.mark.parametrize(("path", "body"), JSON_ROUTES)
@pytest.mark.parametrize("bad", BAD_TEXT)
async def test_invalid_utf8_inside_a_json_string_is_400_on_every_json_route(
        make_api: MakeApi, path: str, body: dict[str, object], bad: bytes) -> None:
    api = await make_api()
    raw = with_bad_text(body, bad)
    assert bad in raw
    for content_type in ("application/json", "application/json; charset=utf-8"):
        r = await api.client.post(path, content=raw, headers={"Content-Type": content_type})
        assert r.status_code == 400, (content_type, r.text)
        assert "UTF-8" in r.json()["detail"]
    # a body without a type is refused before it is read (tests/security/test_http_guard.py)
    r = await api.client.post(path, content=raw)
    assert r.status_code == 415, r.text
    # Nothing of it was kept.
    assert await api.queued("default") == 0


async def test_a_lone_surrogate_escape_in_a_queue_request_is_never_a_5xx(
        make_api: MakeApi) -> None:
    api = await make_api()
    await api.client.post("/task/", json={"url": "https://example.com/"})
    [leased] = (await api.client.post("/queues/default/lease", json={"n": 1})).json()
    receipt = leased["receipt"]
    for path, body in [
        ("/queues/default/ack", f'{{"ids": ["{receipt}\\ud800"]}}'),
        ("/queues/default/nack", f'{{"ids": ["{receipt}"], "dead": true,'
                                 ' "reason": "bad \\udc00 text"}'),
        ("/queues/default/ack", '{"ids": ["\\ud800"]}'),
    ]:
        r = await api.client.post(path, content=body.encode(),
                                  headers={"Content-Type": "application/json"})
        assert r.status_code < 500, (path, body, r.text)
        assert isinstance(r.json(), dict)


async def test_a_body_over_max_body_bytes_is_413_on_model_routes_too(make_api: MakeApi) -> None:
    api = await make_api(server={"max_body_bytes": 200})
    big = json.dumps({"ids": ["x" * 50] * 10}).encode()
    r = await api.client.post("/queues/default/ack", content=big,
                              headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]


def read_answer(sock: socket.socket, trickle: bytes, limit: float = 60.0) -> bytes:
    """Keep sending ``trickle`` one byte at a time (the slow client) until the server
    answers and closes; everything the server sent."""
    sock.settimeout(0.05)
    received = b""
    sent = 0
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if sent < len(trickle):
                try:
                    sock.sendall(trickle[sent:sent + 1])
                except OSError:  # the server closed its side
                    pass
                sent += 1
            continue
        except ConnectionResetError:
            # the server answered and closed while the slow client still sent: its
            # close of a socket with unread bytes is a reset
            if received:
                return received
            break
        if not chunk:
            return received  # closed by the server
        received += chunk
    raise AssertionError(f"no answer and close within {limit} s; got {received!r}")


@pytest.mark.parametrize("http_impl", HTTP_IMPLEMENTATIONS)
@pytest.mark.parametrize("path", ["/task/", "/queues/default/lease"])
def test_a_body_trickling_in_is_cut_off_with_408_and_the_connection_closed(
        tmp_path: Path, http_impl: str, path: str) -> None:
    app = create_app(CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path),
        "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": "default", "init": {"key": "default"}}],
        "server": {"body_timeout": "0.5s"},
    }))
    body = b'{"url": "https://example.com/", "pad": "' + b"x" * 5000 + b'"}'
    with serve(app, http=http_impl) as port:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                         f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:10])
            answer = read_answer(sock, body[10:])
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        assert b"connection: close" in head.lower()
        assert "body_timeout" in json.loads(payload)["detail"]
        # The worker is free: the next client is served at once.
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            sock.settimeout(30)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_body_timeout_is_a_duration_setting_with_a_30_s_default() -> None:
    assert CrawlhubConfig.model_validate({}).server.body_timeout == 30.0
    assert CrawlhubConfig.model_validate(
        {"server": {"body_timeout": "2m"}}).server.body_timeout == 120.0

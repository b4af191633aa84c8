"""Request bodies kept honest before any router reads them: a body must arrive in full
within ``server.body_timeout`` (408 otherwise), stay within ``server.max_body_bytes``
(413) and, when JSON or text, be UTF-8 (400).

A pure ASGI middleware wraps ``receive``; its errors are ``HTTPException``s, so FastAPI's
own body parsing passes them on unchanged and the JSON error handlers answer them.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crawlhub.api.deps import ApiError


class BodyTimeout(ApiError):
    """The request body did not arrive within the time allowed (408, connection closed)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(408, f"request body did not arrive within {timeout:g} s"
                         " (server.body_timeout); send it faster or in smaller requests")
        # The rest of the body may still be on its way: this connection cannot be reused.
        self.headers = {"Connection": "close"}


class BodyGuard:
    """Times, measures and checks every HTTP request body as the app reads it.

    The clock starts at the app's first read of the body; every later read waits only
    for what is left of ``timeout``. Reads after the last chunk (waiting for a
    disconnect) are not timed. A declared ``Content-Length`` over ``max_bytes`` is
    refused before a byte is read.
    """

    def __init__(self, app: ASGIApp, *, timeout: float, max_bytes: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        decoder = codecs.getincrementaldecoder("utf-8")() if _is_text(scope) else None
        declared = _header(scope, b"content-length")
        limit = self.max_bytes
        deadline: float | None = None
        finished = False
        size = 0

        async def guarded_receive() -> Message:
            nonlocal deadline, finished, size
            if finished:
                return await receive()
            if deadline is None:
                if declared.isdigit() and int(declared) > limit:
                    finished = True
                    raise ApiError(413, f"request body of {declared.decode()} bytes is over"
                                   f" the limit of {limit} bytes (server.max_body_bytes);"
                                   " send smaller batches")
                deadline = self.clock() + self.timeout
            try:
                async with asyncio.timeout(max(0.0, deadline - self.clock())):
                    message = await receive()
            except TimeoutError:
                finished = True
                raise BodyTimeout(self.timeout) from None
            if message["type"] != "http.request":
                finished = True
                return message
            more = bool(message.get("more_body", False))
            finished = not more
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                finished = True
                raise ApiError(413, f"request body is over the limit of {limit} bytes"
                               " (server.max_body_bytes); send smaller batches")
            if decoder is not None:
                try:
                    decoder.decode(chunk, final=not more)
                except UnicodeDecodeError as exc:
                    finished = True
                    raise ApiError(400, f"request body is not UTF-8 text (byte {exc.start} of"
                                   " a chunk; surrogates and other invalid sequences are"
                                   " refused); send UTF-8 JSON") from None
            return message

        await self.app(scope, guarded_receive, send)


def _header(scope: Scope, name: bytes) -> bytes:
    return next((v for k, v in scope["headers"] if k == name), b"")


def _is_text(scope: Scope) -> bool:
    """JSON, text or an undeclared body: what the API reads as text and must be UTF-8."""
    kind = _header(scope, b"content-type").partition(b";")[0].strip().lower()
    return not kind or kind.endswith(b"json") or kind.startswith(b"text/")

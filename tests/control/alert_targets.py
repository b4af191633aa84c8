"""Real alert targets on 127.0.0.1 for tests: a webhook receiver (aiohttp, in the test's
event loop, or plain http.server in a thread for the CLI) and an SMTP server (aiosmtpd,
in its own thread) that keep what they were sent."""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiohttp import web
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.servers import free_port

#: The path of a Slack-like webhook URL; its last part is the secret token.
TOKEN = "xoxb-T0KEN-7f3a9c1e5d"
HOOK_PATH = f"/services/T01/B02/{TOKEN}"


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class WebhookReceiver:
    """An HTTP server taking webhook POSTs: answers ``status`` after ``delay`` seconds;
    ``redirects`` maps a path to a Location to answer 307 with."""

    status: int = 200
    delay: float = 0.0
    redirects: dict[str, str] = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    async def start(self) -> WebhookReceiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def url(self, path: str = HOOK_PATH) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self, path: str | None = None) -> list[Any]:
        return [h.body for h in self.hits if path is None or h.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if self.delay:
            await asyncio.sleep(self.delay)
        if request.path in self.redirects:
            return web.Response(status=307, headers={"Location": self.redirects[request.path]})
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw
        self.hits.append(Hit(request.path, dict(request.headers), body))
        return web.Response(status=self.status,
                            text="ok" if 200 <= self.status < 300 else "no_service")


class ThreadedReceiver:
    """The webhook receiver for synchronous callers (the CLI): http.server in a thread."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.hits.append(Hit(self.path, dict(self.headers), json.loads(raw)))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def url(self, path: str = HOOK_PATH) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @contextmanager
    def running(self) -> Iterator[ThreadedReceiver]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Mail:
    sender: str
    recipients: list[str]
    message: EmailMessage
    authenticated: bool


class SmtpInbox:
    """An aiosmtpd handler keeping every message; login ``USER`` / ``PASSWORD`` (plain
    text allowed: it is a test server on 127.0.0.1)."""

    USER = "alerts"
    PASSWORD = "smtp-pw-4e9b2a"

    def __init__(self) -> None:
        self.mails: list[Mail] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.mails.append(Mail(envelope.mail_from, list(envelope.rcpt_tos),
                               message,  # type: ignore[arg-type]
                               bool(session.authenticated)))
        return "250 OK queued as 42"

    @classmethod
    def authenticator(cls, server: Any, session: Any, envelope: Any, mechanism: str,
                      auth_data: Any) -> AuthResult:
        ok = (isinstance(auth_data, LoginPassword) and auth_data.login == cls.USER.encode()
              and auth_data.password == cls.PASSWORD.encode())
        return AuthResult(success=ok, handled=False)  # handled=False: aiosmtpd answers 535


@contextmanager
def smtp_server() -> Iterator[tuple[SmtpInbox, int]]:
    """An SMTP server on 127.0.0.1 (its own thread); yields (inbox, port)."""
    inbox = SmtpInbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port,
                            authenticator=SmtpInbox.authenticator, auth_require_tls=False)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()

"""``crawlhub serve`` with Scrapyd's API: the server's own uvicorn server and a second one
on ``scrapyd.bind:scrapyd.port``, in one event loop, over the same services. The second
leaves the process's signals to the first and stops when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from typing import Any

import uvicorn

from crawlhub.app.asgi import create_scrapyd_app
from crawlhub.core.errors import ConfigError
from crawlhub.core.hosts import is_loopback


class _Follower(uvicorn.Server):
    """A uvicorn server that installs no signal handlers: the main server's take Ctrl-C
    and SIGTERM, and this one stops with it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def exposure(cfg: Any) -> str | None:
    """Why serving Scrapyd's API is unsafe, or None: like ``server.bind``, an address
    other machines reach needs ``server.token`` (schedule.json runs spiders)."""
    section = cfg.scrapyd
    if not section.enabled or cfg.server.token is not None or is_loopback(section.bind):
        return None
    return (f"scrapyd.bind is {section.bind!r} (reachable from other machines) and"
            " server.token is not set: anyone who reaches the port could upload eggs and"
            " run them")


def listen(cfg: Any) -> socket.socket:
    """The Scrapyd port's socket, bound before anything starts: a port in use is an error
    naming the key to change."""
    section = cfg.scrapyd
    family = socket.AF_INET6 if ":" in section.bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((section.bind.strip("[]"), section.port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {section.bind}:{section.port} for Scrapyd's"
                          f" API: {exc.strerror or exc}; choose another scrapyd.port (or"
                          " scrapyd.bind)", entry="scrapyd", key="port",
                          file=cfg.file_of("scrapyd", "port")) from None
    sock.set_inheritable(True)
    return sock


def serve_with_scrapyd(server: uvicorn.Server, app: Any, cfg: Any, sock: socket.socket
                       ) -> None:
    """Run ``server`` (the main one, serving ``app``) and Scrapyd's API on ``sock`` until
    the main one stops; raises what ``server.run()`` raises."""
    follower = _Follower(uvicorn.Config(create_scrapyd_app(app, cfg), lifespan="off",
                                        log_level=cfg.logging.level.lower(),
                                        access_log=False, ws="none"))

    async def stop_with_main() -> None:
        while not server.should_exit:
            await asyncio.sleep(0.1)
        follower.should_exit = True

    async def both() -> None:
        scrapyd = asyncio.create_task(follower.serve(sockets=[sock]), name="scrapyd api")
        watch = asyncio.create_task(stop_with_main())
        try:
            await server.serve()
        finally:
            follower.should_exit = True
            watch.cancel()
            await asyncio.gather(scrapyd, watch, return_exceptions=True)

    asyncio.run(both())

"""Failed logins and failed bearer tokens, counted per client address: past a few, every
further try waits a growing delay, answered 429 with ``Retry-After`` (the right token too,
or the 429s would tell a guesser when it hit).

In memory, per server process; a client is its address (behind a proxy every client is
the proxy's: docs/security.md).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("crawlhub.api")

#: Wrong tokens a client may send before it has to wait.
FREE_FAILURES = 5
#: The first wait (seconds); it doubles with every further failure, up to MAX_DELAY.
FIRST_DELAY = 1.0
MAX_DELAY = 300.0
#: A client forgotten after this long without a failure.
FORGET_AFTER = 900.0
#: Clients remembered at most (a flood from many addresses drops the stalest first).
MAX_CLIENTS = 10_000


@dataclass
class _Record:
    failures: int
    last: float


class Throttle:
    """Per client: :meth:`wait` says how long it must wait before its next try (0: may
    try now), :meth:`failed` counts a wrong token and logs it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._clients: dict[str, _Record] = {}

    def wait(self, client: str) -> float:
        """Seconds ``client`` must wait before its next try (0 when it may try now)."""
        record = self._clients.get(client)
        if record is None:
            return 0.0
        now = self.clock()
        if now - record.last >= FORGET_AFTER:
            del self._clients[client]
            return 0.0
        return max(0.0, record.last + self.delay(record.failures) - now)

    @staticmethod
    def delay(failures: int) -> float:
        if failures < FREE_FAILURES:
            return 0.0
        return min(MAX_DELAY, FIRST_DELAY * 2.0 ** (failures - FREE_FAILURES))

    def failed(self, client: str, what: str) -> None:
        """Count a wrong token of ``client`` (``what``: "bearer token", "login") and log it,
        never the token."""
        now = self.clock()
        record = self._clients.get(client)
        if record is None or now - record.last >= FORGET_AFTER:
            if len(self._clients) >= MAX_CLIENTS:
                self._forget(now)
            record = self._clients[client] = _Record(0, now)
        record.failures += 1
        record.last = now
        delay = self.delay(record.failures)
        if delay:
            log.warning("wrong %s from %s (%d in a row): its next try waits %g s", what,
                        client, record.failures, delay)
        else:
            log.warning("wrong %s from %s (%d in a row)", what, client, record.failures)

    def _forget(self, now: float) -> None:
        for client in [c for c, r in self._clients.items() if now - r.last >= FORGET_AFTER]:
            del self._clients[client]
        while len(self._clients) >= MAX_CLIENTS:  # the stalest go first
            del self._clients[min(self._clients, key=lambda c: self._clients[c].last)]


def client_of(scope: object) -> str:
    """The client of an ASGI scope, as counted: its IPv4 address, or its IPv6 /64 (one
    host holds a whole /64 and could take a new address for every try); ``?`` when the
    server gave none."""
    client = scope.get("client") if isinstance(scope, dict) else None
    if not client:
        return "?"
    host = str(client[0])
    if ":" in host:
        try:
            return str(ipaddress.IPv6Network(f"{host.partition('%')[0]}/64", strict=False))
        except ValueError:
            return host
    return host

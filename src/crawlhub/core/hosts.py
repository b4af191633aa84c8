"""Which host names and addresses only this machine reaches (the one test of it: the
server's exposure check, the request guard, the demo's bind and git URLs of projects)."""

from __future__ import annotations

import ipaddress

#: Names of this machine that a page on another site can never make a browser use for us.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback(host: str) -> bool:
    """True for ``localhost``, ``127.0.0.0/8`` and ``::1`` (bracketed or not, any case,
    spaces around ignored): addresses only this machine reaches. Any other name or
    address (``0.0.0.0``, ``::``, a LAN address, a host name) may be reached from
    elsewhere."""
    host = host.strip().lower().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

"""Where a webhook may go: the :class:`TargetPolicy` of ``control.alert_allowed_hosts``
and ``control.alert_denied_networks``, checked when a route is stored and, through
:func:`policy_resolver`, by the resolver every delivery connects with."""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from crawlhub.control.alerts.model import AlertError
from crawlhub.control.config import DEFAULT_DENIED_NETWORKS
from crawlhub.core.errors import ConfigError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str], key: str = "control.alert_denied_networks"
                   ) -> tuple[IPNetwork, ...]:
    """``values`` as networks (an address alone is a /32 or /128); :class:`ConfigError`
    naming the bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError:
            raise ConfigError(f"{str(value)[:80]!r} is not an IP network: write one like"
                              " 169.254.0.0/16, fe80::/10 or 10.1.2.3", key=key) from None
    return tuple(networks)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address (an IPv4-mapped IPv6 one as its IPv4), or None."""
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """Which hosts a webhook may reach. ``allowed_hosts``: when not empty, a URL's host
    must be one of them (``hooks.slack.com``, ``*.example.com`` for any name below it,
    or an IP address); ``denied_networks``: no address the host is or resolves to may
    lie in one (checked for allowed hosts too)."""

    allowed_hosts: tuple[str, ...] = ()
    denied_networks: tuple[IPNetwork, ...] = parse_networks(DEFAULT_DENIED_NETWORKS)

    @classmethod
    def of(cls, allowed_hosts: Iterable[str] = (),
           denied_networks: Iterable[str] = DEFAULT_DENIED_NETWORKS) -> TargetPolicy:
        return cls(tuple(h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip()),
                   parse_networks(denied_networks))

    def host_problem(self, host: str) -> str | None:
        """Why a URL naming ``host`` may not be posted to (None: it may, as far as the
        name tells; the addresses it resolves to are checked on their own)."""
        name = host.lower().strip("[]").rstrip(".")
        if self.allowed_hosts and not any(self._allows(entry, name)
                                          for entry in self.allowed_hosts):
            return (f"the webhook host {name[:100]} is not in control.alert_allowed_hosts;"
                    " use a listed host, or ask the operator to list it")
        address = _address(name)
        return None if address is None else self.address_problem(address, name)

    def address_problem(self, address: Any, host: str) -> str | None:
        """Why ``address`` (what ``host`` is or resolves to) may not be connected to."""
        if not isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
            address = _address(str(address))
            if address is None:
                return f"the webhook host {host[:100]} resolves to something not an address"
        for network in self.denied_networks:
            if address.version == network.version and address in network:
                return (f"the webhook host {host[:100]} is in a denied network ({network};"
                        " link-local and cloud metadata addresses by default,"
                        " control.alert_denied_networks)")
        return None

    @staticmethod
    def _allows(entry: str, name: str) -> bool:
        if entry.startswith("*."):
            return name.endswith(entry[1:]) and len(name) > len(entry) - 1
        entry_address, address = _address(entry), _address(name)
        if entry_address is not None and address is not None:
            return entry_address == address
        return entry == name

    async def check(self, url: str, timeout: float) -> None:
        """:class:`AlertError` when the policy refuses ``url``'s host or an address it
        resolves to now. A name that does not resolve is let through: delivery checks
        again."""
        host = urlsplit(url).hostname or ""
        problem = self.host_problem(host)
        if problem is None and _address(host) is None:
            try:
                async with asyncio.timeout(timeout):
                    infos = await asyncio.get_running_loop().getaddrinfo(
                        host, None, type=socket.SOCK_STREAM)
            except (OSError, TimeoutError):
                infos = []
            problem = next((p for p in (self.address_problem(info[4][0], host)
                                        for info in infos) if p), None)
        if problem is not None:
            raise AlertError(problem)


class TargetRefused(OSError):
    """A webhook host that resolves to an address the :class:`TargetPolicy` denies."""


@functools.cache
def policy_resolver() -> type:
    """The resolver class (made on first use: aiohttp is imported only when sending)."""
    import aiohttp
    from aiohttp.abc import AbstractResolver, ResolveResult

    class PolicyResolver(AbstractResolver):
        """aiohttp's resolver, refusing every answer that holds a denied address: the
        addresses checked are the ones connected to (no gap for DNS to change in)."""

        def __init__(self, policy: TargetPolicy) -> None:
            self.policy = policy
            self.inner = aiohttp.DefaultResolver()

        async def resolve(self, host: str, port: int = 0,
                          family: socket.AddressFamily = socket.AF_INET
                          ) -> list[ResolveResult]:
            found = await self.inner.resolve(host, port, family)
            for result in found:
                problem = self.policy.address_problem(result["host"], host)
                if problem is not None:
                    raise TargetRefused(errno.EACCES, problem)
            return found

        async def close(self) -> None:
            await self.inner.close()

    return PolicyResolver



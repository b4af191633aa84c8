"""robots.txt for every agent on one backend: each origin's file fetched once per TTL
(whoever claims the fetch first), cached in the gate's store, parsed with Protego.

How a fetch is read (RFC 9309): 2xx - its rules apply; 4xx (and too many redirects) -
no rules, everything is allowed; 5xx or no answer - everything is disallowed until the
shorter ``error_ttl`` passes and the file is fetched again. Only the first ``max_bytes``
(500 KiB, as Google reads) are kept, cut at the last whole line; a file Protego cannot
read allows everything (and is logged).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from crawlhub.agents.politeness.base import GateStore, RobotsEntry
from crawlhub.core.clock import Clock, system_clock

log = logging.getLogger("crawlhub.agents.robots")

#: ``(robots.txt URL, max bytes) -> (status, body)``; raising means "no answer".
RobotsFetcher = Callable[[str, int], Awaitable[tuple[int, bytes]]]
Sleep = Callable[[float], Awaitable[Any]]

DEFAULT_TTL = 3600.0
DEFAULT_ERROR_TTL = 300.0
MAX_BYTES = 500 * 1024
#: How long one process may hold the right to fetch an origin's robots.txt.
CLAIM_LEASE = 30.0
#: Parsed files kept in memory per process (the oldest go first).
LOCAL_ENTRIES = 10_000
#: Bodies at least this large are parsed on a worker thread, off the event loop.
THREAD_PARSE = 64 * 1024


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why robots.txt keeps a URL from being fetched: its origin's rules disallow it
    (``status`` 2xx), or its robots.txt could not be had - no answer (``status`` 0,
    ``error`` says why) or a 5xx - which RFC 9309 reads as everything disallowed until
    the file is fetched again."""

    origin: str
    status: int
    error: str = ""

    @property
    def unavailable(self) -> bool:
        """The file could not be had (no answer, or 5xx): not the site's rules."""
        return self.status == 0 or self.status >= 500

    def __str__(self) -> str:
        if self.status == 0:
            return (f"robots.txt of {self.origin} unreachable ({self.error or 'no answer'}):"
                    " everything disallowed until it is fetched again (RFC 9309)")
        if self.status >= 500:
            return (f"robots.txt of {self.origin} answered {self.status}: everything"
                    " disallowed until it is fetched again (RFC 9309)")
        return "disallowed by robots.txt"


@dataclass(frozen=True, slots=True)
class _Unavailable:
    """The rules of an origin whose robots.txt could not be had: none at all."""

    status: int
    error: str


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` (lower case): whose robots.txt applies."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.hostname:
        raise ValueError(f"{url!r} is not an absolute http(s) URL")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    scheme = parts.scheme.lower()
    default = {"http": 80, "https": 443}.get(scheme)
    port = f":{parts.port}" if parts.port and parts.port != default else ""
    return f"{scheme}://{host}{port}"


def http_fetcher(user_agent: str, *, timeout: float = 10.0, redirects: int = 5
                 ) -> RobotsFetcher:
    """The default fetcher: aiohttp, ``user_agent`` sent, at most ``redirects`` hops;
    the body is read until ``max_bytes`` and the rest never downloaded."""

    async def fetch(url: str, max_bytes: int) -> tuple[int, bytes]:
        import aiohttp

        from crawlhub.fetch.http import client_timeout, new_session, read_prefix

        async with new_session(timeout=client_timeout(timeout),
                               headers={"User-Agent": user_agent}) as session:
            try:
                async with session.get(url, max_redirects=redirects) as response:
                    body = b""
                    if 200 <= response.status < 300:
                        body = await read_prefix(response, max_bytes)
                    return response.status, body
            except aiohttp.TooManyRedirects:
                return 404, b""  # RFC 9309: past the redirect limit counts as unavailable

    return fetch


def _cut(body: bytes, max_bytes: int) -> bytes:
    if len(body) <= max_bytes:
        return body
    body = body[:max_bytes]
    end = max(body.rfind(b"\n"), body.rfind(b"\r"))
    return body[: end + 1] if end >= 0 else b""


def _parse(body: bytes) -> Any:
    from protego import Protego

    return Protego.parse(body.decode("utf-8", errors="replace"))


class RobotsCache:
    """``allowed(url, user_agent)`` for one process, over the store every agent shares.

    Cost: a parsed file is kept in memory until its entry expires, so a check is no
    round trip at all; a miss is one read, or a claim, a fetch and a write.
    """

    def __init__(self, store: GateStore, fetcher: RobotsFetcher, *,
                 ttl: float = DEFAULT_TTL, error_ttl: float = DEFAULT_ERROR_TTL,
                 max_bytes: int = MAX_BYTES, clock: Clock = system_clock,
                 sleep: Sleep = asyncio.sleep, poll: float = 0.05) -> None:
        if ttl <= 0 or error_ttl <= 0 or max_bytes <= 0:
            raise ValueError("robots ttl, error_ttl and max_bytes must be > 0")
        self.store = store
        self.fetcher = fetcher
        self.ttl = ttl
        self.error_ttl = error_ttl
        self.max_bytes = max_bytes
        self.clock = clock
        self.sleep = sleep
        self.poll = poll
        #: origin -> (expires, parser, or True: everything allowed, or _Unavailable:
        #: everything disallowed)
        self._local: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        #: origin -> why this process's last fetch of its robots.txt got no answer
        self._errors: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: Fetches this process made (tests read it; the servers count theirs).
        self.fetches = 0

    async def allowed(self, url: str, user_agent: str) -> bool:
        """Whether ``user_agent`` may fetch ``url`` by its origin's robots.txt."""
        return await self.refusal(url, user_agent) is None

    async def refusal(self, url: str, user_agent: str) -> Refusal | None:
        """Why ``user_agent`` may not fetch ``url`` by its origin's robots.txt (None: it
        may): the site's rules, or a robots.txt that could not be had."""
        origin = origin_of(url)
        rules = await self._rules(origin)
        if rules is True:
            return None
        if isinstance(rules, _Unavailable):
            return Refusal(origin, rules.status, rules.error)
        try:
            if rules.can_fetch(url, user_agent):
                return None
        except Exception:  # noqa: BLE001 - a rule Protego cannot apply blocks nothing
            log.warning("robots.txt of %s: cannot check %s; allowed", origin, url,
                        exc_info=True)
            return None
        return Refusal(origin, 200)

    async def _rules(self, origin: str) -> Any:
        now = self.clock()
        cached = self._local.get(origin)
        if cached is not None and cached[0] > now:
            return cached[1]
        lock = self._locks.setdefault(origin, asyncio.Lock())
        async with lock:
            cached = self._local.get(origin)
            if cached is not None and cached[0] > self.clock():
                return cached[1]
            entry = await self._entry(origin)
            rules = await self._interpret(origin, entry)
            self._local[origin] = (entry.expires, rules)
            self._local.move_to_end(origin)
            while len(self._local) > LOCAL_ENTRIES:
                old, _ = self._local.popitem(last=False)
                held = self._locks.get(old)
                if held is not None and not held.locked():
                    del self._locks[old]
        return rules

    async def _entry(self, origin: str) -> RobotsEntry:
        """A fresh entry: from the store, or fetched by this process if it wins the
        claim, or waited for while another process fetches it."""
        poll = self.poll
        while True:
            now = self.clock()
            entry = await self.store.robots_get(origin)
            if entry is not None and entry.expires > now:
                return entry
            if await self.store.robots_claim(origin, now, now + CLAIM_LEASE):
                entry = await self._fetch(origin)
                await self.store.robots_put(origin, entry, self.clock())
                return entry
            # Another process fetches it (or died doing so: its claim runs out).
            await self.sleep(poll)
            poll = min(poll * 2, 1.0)

    async def _fetch(self, origin: str) -> RobotsEntry:
        self.fetches += 1
        try:
            status, body = await self.fetcher(f"{origin}/robots.txt", self.max_bytes)
        except Exception as exc:  # noqa: BLE001 - any failure means "no answer"
            from crawlhub.fetch.http import unreachable_reason

            self._errors[origin] = unreachable_reason(exc)
            log.warning("robots.txt of %s: no answer (%s: %s); everything disallowed for"
                        " %s s", origin, type(exc).__name__, exc, self.error_ttl)
            status, body = 0, b""
        now = self.clock()
        ttl = self.error_ttl if status == 0 or status >= 500 else self.ttl
        return RobotsEntry(status=status, body=_cut(body, self.max_bytes), expires=now + ttl)

    async def _interpret(self, origin: str, entry: RobotsEntry) -> Any:
        if entry.status == 0 or entry.status >= 500:
            return _Unavailable(entry.status, self._errors.pop(origin, ""))
        if not 200 <= entry.status < 300:
            return True
        try:
            if len(entry.body) >= THREAD_PARSE:
                return await asyncio.to_thread(_parse, entry.body)
            return _parse(entry.body)
        except Exception:  # noqa: BLE001 - an unreadable file: no rules
            log.warning("robots.txt of %s cannot be read; everything allowed", origin,
                        exc_info=True)
            return True

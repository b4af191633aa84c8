"""The downloader: one request in, one ``Fetched`` out, whatever happened on the way.

It owns one aiohttp connector (the connection pool) shared by per-job sessions, so each
job has its own cookie jar; follows redirects itself (with a limit), stops reading a body
past ``max_size``, and applies ban rules: a banned response retires its proxy for a
cooldown, clears the job's cookies and retries on another proxy, up to ``ban.retries``.
The pool, the sessions, query parameters and the capped body read are the building blocks
of ``crawlhub.fetch.http``, the one HTTP client layer; the policy (outcomes, redirects,
bans, proxies) is here.

It takes ``crawlhub.fetch.http.Request`` as input but answers ``Fetched``, not
``fetch.http.Response``: a ``Response`` promises a complete HTTP response, while a download
can end without one (timeout, connection error, too large, banned with no proxy left), and
the agent needs the outcome name and the proxy used. ``Fetched.response()`` gives the
``Response`` view of a download that has one.

Hot-path cost per request: a dict lookup for the job's session, one aiohttp request (no
session, timeout object or regex created per request), the body read once (``read()`` when
the length is known and the body is not compressed, else streamed in chunks), one
``frozenset`` test and at most one precompiled bytes-regex search for the ban rules.
Measured against a local site in another process, 64 concurrent, 2 KB pages: ~85-115 us
CPU per page, ~15-25 us above a bare ``aiohttp`` request loop on the same machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import aiohttp

from crawlhub.agents.codes import (
    BANNED,
    CONNECTION_ERROR,
    HTTP_ERROR,
    INVALID_URL,
    SUCCESS,
    TIMEOUT,
    TOO_LARGE,
    TOO_MANY_REDIRECTS,
)
from crawlhub.agents.config import DEFAULT_USER_AGENT as DEFAULT_USER_AGENT  # (old name)
from crawlhub.agents.config import BanRules, DownloaderConfig
from crawlhub.agents.proxies import ProxyPool
from crawlhub.core.redact import redact_url
from crawlhub.core.userregex import compile_user_test
from crawlhub.fetch.http import (
    REDIRECT_STATUSES,
    Request,
    Response,
    add_cookies,
    client_timeout,
    new_connector,
    new_session,
    query_params,
    read_capped,
    redirect_target,
    same_origin_only,
    session_cookies,
    unreachable_reason,
)

if TYPE_CHECKING:
    from yarl import URL

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
@dataclass(slots=True)
class Fetched:
    """What one download ended in.

    ``outcome`` is a name from ``crawlhub.agents.codes`` (``success``, ``http_error``,
    ``timeout``, ``connection_error``, ``banned``, ``too_large``, ``too_many_redirects``,
    ``invalid_url``);
    ``ResultCodes.code(outcome, status)`` turns it into the result code. ``status`` is 0
    and ``body`` empty when no response came; ``final_url`` is where redirects ended;
    ``proxy`` the proxy of the last attempt (``None`` when direct); ``attempts`` counts
    tries (more than 1 after bans); ``error`` says what went wrong, credentials masked.
    """

    url: str
    final_url: str
    status: int
    headers: Mapping[str, str]
    body: bytes
    elapsed: float
    proxy: str | None
    outcome: str
    redirects: int = 0
    attempts: int = 1
    error: str = ""
    #: the download center's agent that downloaded it ("" when downloaded here)
    agent: str = ""
    #: what that agent extracted (``crawlhub.agents.extract.Extracted``), or None
    extracted: Any = None

    @property
    def ok(self) -> bool:
        return self.outcome == SUCCESS

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")

    def response(self, request: Request | None = None) -> Response | None:
        """This download as a ``fetch.http.Response`` (``None`` when no response came)."""
        if not self.status:
            return None
        return Response(
            request=request or Request(self.url),
            status=self.status,
            body=self.body,
            headers=self.headers,
            url=self.final_url,
            elapsed=self.elapsed,
        )


@dataclass(slots=True)
class _JobSession:
    session: aiohttp.ClientSession
    last_used: float
    active: int = 0


class Downloader:
    """Fetch URLs for many jobs over one connection pool.

    Use as ``async with Downloader(config) as d: fetched = await d.fetch(url, job="j1")``.
    ``clock`` (seconds, e.g. ``time.monotonic`` or a test's FakeClock) drives idle session
    release and proxy cooldowns; a ``proxies`` pool given here wins over ``config.proxies``.
    The downloader lives on one event loop; ``fetch`` may be called concurrently.
    """

    def __init__(
        self,
        config: DownloaderConfig | None = None,
        *,
        proxies: ProxyPool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config = config or DownloaderConfig()
        self._clock = clock
        self.proxies = proxies if proxies is not None else ProxyPool.from_config(
            config.proxies, clock=clock
        )
        self._timeout = client_timeout(config.timeout, config.connect_timeout)
        self._max_size = config.max_size
        self._max_redirects = config.max_redirects
        self._ban_statuses = frozenset(config.ban.statuses)
        body_regex = config.ban.body_regex
        # RE2: a body cannot make the match slow, whatever the pattern
        self._ban_search = compile_user_test(body_regex.encode()) if body_regex else None
        self._ban_retries = config.ban.retries
        self._ban_cooldown = config.ban.cooldown
        self._idle = config.session_idle
        self._next_sweep = clock() + self._idle
        self._connector: aiohttp.TCPConnector | None = None
        self._sessions: dict[str, _JobSession] = {}
        self._plain: aiohttp.ClientSession | None = None
        self._closed = False
        # stats (see ``stats``): plain ints on the hot path, named on the way out
        self.requests = 0
        self.bans = 0
        self.retries = 0
        self.redirects = 0
        self.bytes = 0
        self.sessions_created = 0
        self.sessions_released = 0
        self.outcomes: dict[str, int] = {}

    async def __aenter__(self) -> Downloader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- sessions -------------------------------------------------------------------

    def _connector_now(self) -> aiohttp.TCPConnector:
        if self._connector is None or self._connector.closed:
            if self._closed:
                raise RuntimeError("the downloader is closed")
            self._connector = new_connector(
                limit=self.config.concurrency, per_host=self.config.per_host, dns_ttl=300
            )
        return self._connector

    def _new_session(self) -> aiohttp.ClientSession:
        self.sessions_created += 1
        return new_session(
            connector=self._connector_now(),
            owns_connector=False,
            # keep cookies of sites addressed by IP too (127.0.0.1, intranets)
            cookies="all",
            headers=self.config.headers,
            timeout=self._timeout,
        )

    @property
    def sessions(self) -> list[str]:
        """The jobs that hold a session (cookie jar) now."""
        return list(self._sessions)

    def cookies(self, job: str = "") -> dict[str, str]:
        """The cookies the job's session holds now, name -> value (empty when it has none)."""
        held = self._sessions.get(job)
        if held is None:
            return {}
        return session_cookies(held.session)

    def seed_cookies(self, job: str, cookies: Mapping[str, str]) -> None:
        """Put ``cookies`` (name -> value) in the job's cookie jar (its session is made
        now if it has none): sent to every host, as a browser session's cookies are."""
        held = self._sessions.get(job)
        if held is None:
            held = self._sessions[job] = _JobSession(self._new_session(), self._clock())
        add_cookies(held.session, cookies)

    def cookie_jar(self, job: str = "") -> aiohttp.abc.AbstractCookieJar:
        """The job's cookie jar (its session is made now if it has none), kept as used:
        the browser downloader shares it with the contexts rendering the job's pages."""
        held = self._sessions.get(job)
        if held is None:
            held = self._sessions[job] = _JobSession(self._new_session(), self._clock())
        held.last_used = self._clock()
        return held.session.cookie_jar

    async def release(self, job: str) -> bool:
        """Drop the job's session and cookies now (e.g. when the job ends)."""
        held = self._sessions.pop(job, None)
        if held is None:
            return False
        self.sessions_released += 1
        await held.session.close()  # connector_owner=False: the pool stays open
        return True

    async def release_idle(self) -> int:
        """Release every session unused for ``session_idle`` s with no request in flight;
        return how many. ``fetch`` calls this by itself at most every ``session_idle`` s."""
        now = self._clock()
        self._next_sweep = now + self._idle
        idle = [
            job
            for job, held in self._sessions.items()
            if held.active == 0 and now - held.last_used >= self._idle
        ]
        for job in idle:
            await self.release(job)
        return len(idle)

    # --- fetching -------------------------------------------------------------------

    async def fetch(self, request: Request | str, *, job: str = "") -> Fetched:
        """Download ``request`` (a URL or a ``fetch.http.Request``) in ``job``'s session.

        Never raises for what the network or the site does: every end is a ``Fetched``
        with an outcome. Bans are retried here on other proxies; timeouts, connection
        errors and HTTP errors are returned at once for the hub's retry rules to judge.
        """
        req = Request(request) if isinstance(request, str) else request
        clock = self._clock
        now = clock()
        if now >= self._next_sweep:
            await self.release_idle()
        pool = self.proxies
        use_proxies = pool.configured
        tried: set[str] | None = None
        attempts = 0
        result: Fetched | None = None
        while True:
            attempts += 1
            proxy: str | None = None
            if use_proxies:
                if pool.provider_url is not None and (pool.refreshing or pool.due_refresh()):
                    await pool.maybe_refresh(self._plain_session())
                proxy = pool.pick(tried or ())
                if proxy is None:
                    if result is not None:
                        return result  # the last banned try: nothing left to retry on
                    return self._count(self._no_proxy(req, attempts))
            held = self._sessions.get(job)
            if held is None:
                held = self._sessions[job] = _JobSession(self._new_session(), now)
            held.active += 1
            try:
                result, proxy_failed = await self._attempt(held.session, req, proxy)
            finally:
                held.active -= 1
                held.last_used = clock()
            result.attempts = attempts
            if result.outcome != BANNED and not proxy_failed:
                return self._count(result)
            if result.outcome == BANNED:
                self.bans += 1
                held.session.cookie_jar.clear()  # the site knows this session: start afresh
            if proxy is not None:
                pool.retire(proxy, self._ban_cooldown)
                if tried is None:
                    tried = set()
                tried.add(proxy)
            if attempts > self._ban_retries:
                return self._count(result)
            self.retries += 1

    def _count(self, result: Fetched) -> Fetched:
        self.requests += 1
        outcomes = self.outcomes
        outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
        self.bytes += len(result.body)
        self.redirects += result.redirects
        return result

    def _no_proxy(self, req: Request, attempts: int) -> Fetched:
        return Fetched(
            req.url, req.url, 0, _NO_HEADERS, b"", 0.0, None, BANNED,
            attempts=attempts,
            error=f"no proxy available: all {len(self.proxies.proxies)} are retired "
                  "or none came from the provider",
        )

    async def _attempt(
        self, session: aiohttp.ClientSession, req: Request, proxy: str | None
    ) -> tuple[Fetched, bool]:
        """One try through ``proxy``, redirects included. Returns the result and whether
        the proxy itself failed (refused, or answered a CONNECT with an error)."""
        url: str | URL = req.url
        method = req.method
        data = req.data
        json = req.json
        params = query_params(req.params)
        headers = req.headers
        timeout = self._timeout if req.timeout is None else client_timeout(
            req.timeout, self.config.connect_timeout
        )
        hops = 0
        started = time.perf_counter()
        try:
            while True:
                async with session.request(
                    method, url,
                    params=params, headers=headers, data=data, json=json,
                    proxy=proxy, allow_redirects=False, timeout=timeout,
                ) as resp:
                    status = resp.status
                    if status in REDIRECT_STATUSES:
                        location = resp.headers.get("Location")
                        if location:
                            try:
                                target = redirect_target(resp, location)
                            except ValueError as exc:
                                return self._failed(
                                    req, location, started, proxy, hops + 1, INVALID_URL,
                                    f"redirect to an invalid URL: {exc}"[:300],
                                ), False
                            if target.scheme in ("http", "https"):
                                hops += 1
                                if hops > self._max_redirects:
                                    resp.close()
                                    return Fetched(
                                        req.url, str(target), status, resp.headers, b"",
                                        time.perf_counter() - started, proxy,
                                        TOO_MANY_REDIRECTS, redirects=hops - 1,
                                        error=f"more than {self._max_redirects} redirects",
                                    ), False
                                if status == 303 or (status in (301, 302) and method == "POST"):
                                    method, data, json = "GET", None, None
                                if headers and target.origin() != resp.url.origin():
                                    headers = same_origin_only(headers)
                                url, params = target, None
                                continue
                    body = await read_capped(resp, self._max_size)
                    final_url = str(resp.url)
                    if body is None:
                        return Fetched(
                            req.url, final_url, status, resp.headers, b"",
                            time.perf_counter() - started, proxy, TOO_LARGE, redirects=hops,
                            error=f"body larger than max_size {self._max_size} bytes",
                        ), False
                    if status in self._ban_statuses or (
                        self._ban_search is not None and self._ban_search(body)
                    ):
                        outcome = BANNED
                    elif status >= 400:
                        outcome = HTTP_ERROR
                    else:
                        outcome = SUCCESS
                    return Fetched(
                        req.url, final_url, status, resp.headers, body,
                        time.perf_counter() - started, proxy, outcome, redirects=hops,
                    ), False
        except TimeoutError:
            limit = timeout.total
            return self._failed(req, url, started, proxy, hops, TIMEOUT,
                                f"no complete response within {limit:g}s"), False
        except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as exc:
            return self._failed(req, url, started, proxy, hops, INVALID_URL,
                                f"{type(exc).__name__}: {exc}"[:300]), False
        except (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError) as exc:
            return self._failed(req, url, started, proxy, hops, CONNECTION_ERROR,
                                f"proxy failed: {type(exc).__name__}: {exc}"[:300]), True
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return self._failed(req, url, started, proxy, hops, CONNECTION_ERROR,
                                unreachable_reason(exc)[:300]), False

    @staticmethod
    def _failed(
        req: Request, url: str | URL, started: float, proxy: str | None, hops: int,
        outcome: str, error: str,
    ) -> Fetched:
        return Fetched(
            req.url, str(url), 0, _NO_HEADERS, b"", time.perf_counter() - started, proxy,
            outcome, redirects=hops, error=redact_url(error),
        )

    def _plain_session(self) -> aiohttp.ClientSession:
        """A cookie-less session for the proxy provider."""
        if self._plain is None or self._plain.closed:
            self._plain = new_session(
                connector=self._connector_now(), owns_connector=False, cookies="none",
                timeout=self._timeout,
            )
        return self._plain

    # --- the rest -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Namespaced counters: ``downloader/requests``, ``downloader/outcome/<name>``,
        ``downloader/bans``, ``downloader/ban_retries``, ``downloader/redirects``,
        ``downloader/bytes``, ``downloader/sessions/{open,created,released}`` and the proxy
        pool's ``proxies/...``."""
        out: dict[str, Any] = {
            "downloader/requests": self.requests,
            "downloader/bans": self.bans,
            "downloader/ban_retries": self.retries,
            "downloader/redirects": self.redirects,
            "downloader/bytes": self.bytes,
            "downloader/sessions/open": len(self._sessions),
            "downloader/sessions/created": self.sessions_created,
            "downloader/sessions/released": self.sessions_released,
        }
        for name, n in self.outcomes.items():
            out[f"downloader/outcome/{name}"] = n
        if self.proxies.configured:
            out.update(self.proxies.stats())
        return out

    async def close(self) -> None:
        """Close every session and the connection pool."""
        self._closed = True
        for job in list(self._sessions):
            await self.release(job)
        if self._plain is not None:
            await self._plain.close()
        if self._connector is not None:
            await self._connector.close()


__all__ = ["BanRules", "Downloader", "DownloaderConfig", "Fetched"]

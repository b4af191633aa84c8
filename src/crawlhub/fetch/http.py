"""HTTP requests and responses, and the clients that send them (aiohttp; curl_cffi optional).

A client only moves bytes: rate limits, retries and cancellation live in the scheduler,
the retry policy and the token. Each client owns its session, so cookies stay per client.

This is crawlhub's one HTTP client layer: the aiohttp building blocks below (the pool,
timeouts, sessions and their cookie policy, query parameters, credentials on redirects,
size-capped body reads, why a request got no answer) are what ``HttpClient`` here, the
agents' ``Downloader``, the robots.txt fetcher and ``crawlhub submit`` are made of.
"""

from __future__ import annotations

import json as jsonlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractCookieJar
from yarl import URL

from crawlhub.core.errors import ConfigError, FetchError


class RequestTimeout(FetchError):
    """One attempt got no complete response within its timeout."""


class TransportError(FetchError):
    """One attempt failed below HTTP: connection refused or reset, DNS, TLS."""


@dataclass(slots=True)
class Request:
    """One HTTP request; ``meta`` travels with it to the response (e.g. a detail id)."""

    url: str
    method: str = "GET"
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    json: Any = None
    data: bytes | str | None = None
    timeout: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def domain(self) -> str:
        """Host (and port) the request goes to: the key of per-domain scopes."""
        return urlsplit(self.url).netloc.lower()

    @property
    def endpoint(self) -> str:
        """Method and path, without the query: what request logs name."""
        parts = urlsplit(self.url)
        return f"{self.method.upper()} {parts.path or '/'}"


@dataclass(slots=True)
class Response:
    """A complete response: status, headers and body, with the request that asked for it."""

    request: Request
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    elapsed: float = 0.0
    fetched_at: float = field(default_factory=time.time)  # epoch seconds
    _json: Any = field(default=None, repr=False)
    _json_loaded: bool = field(default=False, repr=False)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 400

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding, errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON (cached); ``ValueError`` when it is not JSON."""
        if not self._json_loaded:
            self._json = jsonlib.loads(self.body)
            self._json_loaded = True
        return self._json


class Transport(Protocol):
    """What a fetcher needs from a client: send one request, return the whole response."""

    async def request(self, req: Request, timeout: float | None = None) -> Response: ...

    async def close(self) -> None: ...


class HttpClient:
    """The default client: one ``aiohttp`` session (its own cookie jar), created lazily.

    ``request`` raises ``RequestTimeout`` or ``TransportError`` (both ``FetchError``); an
    HTTP error status is a normal ``Response`` for the retry policy to judge.
    """

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        limit: int = 100,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.timeout = timeout
        self.headers = dict(headers or {})
        self.limit = limit
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session(connector=new_connector(limit=self.limit),
                                        headers=self.headers)
            self._owns_session = True
        return self._session

    async def request(self, req: Request, timeout: float | None = None) -> Response:
        limit = timeout if timeout is not None else (req.timeout or self.timeout)
        session = self._get_session()
        started = time.monotonic()
        try:
            async with session.request(
                req.method,
                req.url,
                params=query_params(req.params),
                headers=req.headers,
                json=req.json,
                data=req.data,
                timeout=aiohttp.ClientTimeout(total=limit),
                allow_redirects=True,
            ) as resp:
                body = await resp.read()
                return Response(
                    request=req,
                    status=resp.status,
                    body=body,
                    headers=dict(resp.headers),
                    url=str(resp.url),
                    elapsed=time.monotonic() - started,
                )
        except TimeoutError as exc:
            raise RequestTimeout(
                f"{req.endpoint} on {req.domain}: no response within {limit:g}s; "
                "raise the timeout or check the server"
            ) from exc
        except aiohttp.ClientError as exc:
            raise TransportError(f"{req.endpoint} on {req.domain}: {exc!r}") from exc

    async def close(self) -> None:
        if self._session is not None and self._owns_session and not self._session.closed:
            await self._session.close()


class CurlCffiClient:
    """A client with browser TLS fingerprints (``pip install 'crawlhub[curl]'``).

    ``impersonate`` names the browser, e.g. ``"chrome"``; same contract as ``HttpClient``.
    """

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        impersonate: str = "chrome",
    ) -> None:
        from crawlhub.core.extras import require

        curl = require("curl_cffi.requests", "curl", needed_by="the curl_cffi HTTP client")
        self.timeout = timeout
        self._session: Any = curl.AsyncSession(headers=dict(headers or {}),
                                                    impersonate=impersonate)

    async def __aenter__(self) -> CurlCffiClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, req: Request, timeout: float | None = None) -> Response:
        from curl_cffi.requests.exceptions import RequestException, Timeout

        limit = timeout if timeout is not None else (req.timeout or self.timeout)
        started = time.monotonic()
        try:
            resp = await self._session.request(
                req.method.upper(),  # type: ignore[arg-type]
                req.url,
                params=query_params(req.params),
                headers=dict(req.headers or {}),
                json=req.json,
                data=req.data,
                timeout=limit,
            )
        except Timeout as exc:
            raise RequestTimeout(
                f"{req.endpoint} on {req.domain}: no response within {limit:g}s"
            ) from exc
        except RequestException as exc:
            raise TransportError(f"{req.endpoint} on {req.domain}: {exc!r}") from exc
        return Response(
            request=req,
            status=resp.status_code,
            body=resp.content,
            headers=dict(resp.headers),
            url=str(resp.url),
            elapsed=time.monotonic() - started,
        )

    async def close(self) -> None:
        await self._session.close()


def make_client(backend: str = "aiohttp", **options: Any) -> HttpClient | CurlCffiClient:
    """The client named in config: ``aiohttp`` (default) or ``curl_cffi``."""
    if backend == "aiohttp":
        return HttpClient(**options)
    if backend in ("curl_cffi", "curl"):
        return CurlCffiClient(**options)
    raise ConfigError(
        f"unknown HTTP client {backend!r}; use 'aiohttp' or 'curl_cffi'", key="fetch.client"
    )


# --- the aiohttp building blocks ---------------------------------------------------------
# Made once per client, pool or job (never per request), but for ``query_params`` and the
# body readers, which are as cheap as writing them out in place.

#: Statuses that redirect (``Location`` says where).
REDIRECT_STATUSES = frozenset((301, 302, 303, 307, 308))
#: Request headers holding credentials (lower case): not sent on to another origin.
ORIGIN_BOUND_HEADERS = frozenset(("authorization", "cookie", "proxy-authorization"))

#: A session's cookie policy: ``safe`` aiohttp's jar (no cookies of hosts addressed by
#: IP), ``all`` keeps those too (127.0.0.1, intranets), ``none`` keeps no cookie at all.
CookiePolicy = Literal["safe", "all", "none"]


def new_connector(*, limit: int = 100, per_host: int = 0, dns_ttl: int = 10,
                  resolver: aiohttp.abc.AbstractResolver | None = None
                  ) -> aiohttp.TCPConnector:
    """A connection pool: ``limit`` connections at most (``per_host`` per host, 0 = no
    limit), DNS answers kept ``dns_ttl`` s; TLS is verified (aiohttp's default).
    ``resolver`` replaces aiohttp's own (the alerts resolve every name through their
    target policy)."""
    return aiohttp.TCPConnector(limit=limit, limit_per_host=per_host, ttl_dns_cache=dns_ttl,
                                resolver=resolver)


def client_timeout(total: float | None, connect: float | None = None) -> aiohttp.ClientTimeout:
    """``total`` s for a whole request (redirects and body included), ``connect`` s for
    getting a connection (None: no limit of its own)."""
    return aiohttp.ClientTimeout(total=total, sock_connect=connect)


def new_session(
    *,
    connector: aiohttp.BaseConnector | None = None,
    owns_connector: bool = True,
    headers: Mapping[str, str] | None = None,
    timeout: aiohttp.ClientTimeout | None = None,
    cookies: CookiePolicy = "safe",
) -> aiohttp.ClientSession:
    """An aiohttp session: its cookie jar (``cookies``), ``headers`` sent with each request,
    ``timeout`` per request (aiohttp's default when None: 5 min in all).

    ``connector`` is the pool (a pool of its own when None); ``owns_connector=False`` shares
    it: closing the session leaves it open, as many sessions (cookie jars) use one pool.
    Proxies are per request (``proxy=``), so one session can use many.
    """
    jar: AbstractCookieJar | None
    if cookies == "safe":
        jar = None  # aiohttp makes its own
    elif cookies == "all":
        jar = aiohttp.CookieJar(unsafe=True)
    else:
        jar = aiohttp.DummyCookieJar()
    return aiohttp.ClientSession(connector=connector, connector_owner=owns_connector,
                                 headers=headers, timeout=timeout, cookie_jar=jar)


def session_cookies(session: aiohttp.ClientSession) -> dict[str, str]:
    """The cookies ``session`` holds now, name -> value."""
    return {c.key: c.value for c in session.cookie_jar}


def add_cookies(session: aiohttp.ClientSession, cookies: Mapping[str, Any]) -> None:
    """Put ``cookies`` (name -> value) in ``session``'s jar: sent to every host, as a
    browser session's cookies are."""
    session.cookie_jar.update_cookies({str(k): str(v) for k, v in cookies.items()})


def query_params(params: Mapping[str, Any] | None) -> dict[str, str] | None:
    """A request's query parameters as aiohttp (and curl_cffi) take them: values as text, a
    ``None`` value left out; ``None`` for none at all.

    The fetch clients once answered ``{}`` for an empty mapping where the downloader answered
    ``None``: both transports treat the two alike (no query added), so one rule serves both.
    """
    if not params:
        return None
    return {str(k): str(v) for k, v in params.items() if v is not None}


def same_origin_only(headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers without credentials, for a redirect to another origin."""
    return {k: v for k, v in headers.items() if k.lower() not in ORIGIN_BOUND_HEADERS}


def redirect_target(response: aiohttp.ClientResponse, location: str) -> URL:
    """Where a redirect's ``Location`` points, resolved against the response's URL
    (``ValueError`` when it is no valid URL)."""
    return response.url.join(URL(location, encoded=False))


async def read_capped(response: aiohttp.ClientResponse, max_size: int) -> bytes | None:
    """The whole body, or ``None`` once it passes ``max_size`` bytes (the connection is
    closed then, so no more of it is read). One ``read()`` when the length is known and the
    body is not compressed, else streamed in chunks."""
    length = response.content_length
    if length is not None:
        if length > max_size:
            response.close()
            return None
        if "Content-Encoding" not in response.headers:
            return await response.read()  # the length bounds it: the fast path
    chunks = []
    total = 0
    async for chunk in response.content.iter_any():
        total += len(chunk)
        if total > max_size:
            response.close()
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def read_prefix(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body's start: all of it when it has at most ``max_bytes``, else more than
    ``max_bytes`` (the read stops at the chunk that passes the limit, the rest is never
    downloaded; the caller cuts it)."""
    chunks: list[bytes] = []
    size = 0
    # read(n) may stop at a chunk: read chunks up to the limit
    async for chunk in response.content.iter_chunked(64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            break
    return b"".join(chunks)


def unreachable_reason(exc: BaseException) -> str:
    """Why a request got no answer, in a few words: ``connection refused``, ``name not
    resolved (...)``, ``no answer within 10 s``; else the error's type and text."""
    import errno
    import os
    import socket

    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "no answer in time"
    cause = getattr(exc, "os_error", None) or exc
    if isinstance(cause, socket.gaierror):
        return f"name not resolved ({cause.strerror or cause})"
    number = getattr(cause, "errno", None)
    if isinstance(number, int) and number in errno.errorcode:
        return os.strerror(number).lower()
    return f"{type(exc).__name__}: {exc}"


__all__ = [
    "ORIGIN_BOUND_HEADERS",
    "REDIRECT_STATUSES",
    "CookiePolicy",
    "CurlCffiClient",
    "HttpClient",
    "Request",
    "RequestTimeout",
    "Response",
    "Transport",
    "TransportError",
    "add_cookies",
    "client_timeout",
    "make_client",
    "new_connector",
    "new_session",
    "query_params",
    "read_capped",
    "read_prefix",
    "redirect_target",
    "same_origin_only",
    "session_cookies",
    "unreachable_reason",
]

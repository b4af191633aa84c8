"""HTTP requests and responses, and the clients that send them (aiohttp; curl_cffi optional).

A client only moves bytes: rate limits, retries and cancellation live in the scheduler,
the retry policy and the token. Each client owns its session, so cookies stay per client.
"""

from __future__ import annotations

import json as jsonlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

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
            self._session = aiohttp.ClientSession(
                headers=self.headers,
                connector=aiohttp.TCPConnector(limit=self.limit),
            )
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
                params=_params(req.params),
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
                params=_params(req.params),
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


def _params(params: Mapping[str, Any] | None) -> dict[str, str] | None:
    if params is None:
        return None
    return {str(k): str(v) for k, v in params.items() if v is not None}


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
    "CurlCffiClient",
    "HttpClient",
    "Request",
    "RequestTimeout",
    "Response",
    "Transport",
    "TransportError",
    "make_client",
    "unreachable_reason",
]

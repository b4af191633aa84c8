"""The proxy pool: a static list or a provider URL (one proxy per line, refreshed), rotated
round-robin; a proxy that got banned or failed is retired for a cooldown, then comes back.

Cost: ``pick`` is O(1) amortised (a cursor over the list, skipping retired proxies);
``retire`` is a dict write. No lock: the pool lives on one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from crawlhub.agents.codes import config_error
from crawlhub.core.redact import redact_url

if TYPE_CHECKING:  # (imported when a provider is read: the config models need no aiohttp)
    import aiohttp


def _check_proxy(value: str) -> str:
    """``value`` stripped, if it is an http(s) proxy URL (aiohttp speaks no SOCKS)."""
    from yarl import URL  # (here: the config models import without yarl, ~5 ms)

    value = value.strip()
    try:
        url = URL(value)
        good = (
            url.scheme in ("http", "https") and bool(url.host) and url.path in ("", "/")
            and not url.query_string and not any(c.isspace() for c in value)
        )
    except (ValueError, TypeError):
        good = False
    if not good:
        raise ValueError(f"{redact_url(value)!r} is not a proxy URL like http://host:port")
    return value


class ProxyConfig(BaseModel):
    """Config key ``proxies``: ``urls`` (a static list; a bare list is taken as ``urls``) and/or ``provider_url`` (a page answering one proxy
    URL per line, re-read every ``refresh_every`` s); a retired proxy sits out ``cooldown`` s."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str] = []
    provider_url: str | None = None
    refresh_every: float = 300.0
    cooldown: float = 300.0

    @model_validator(mode="before")
    @classmethod
    def _bare_list(cls, data: Any) -> Any:
        return {"urls": data} if isinstance(data, list) else data

    @field_validator("urls")
    @classmethod
    def _proxies(cls, value: Iterable[str]) -> list[str]:
        return [_check_proxy(v) for v in value]

    @field_validator("provider_url")
    @classmethod
    def _provider(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{redact_url(value)!r} is not an http(s) URL")
        return value

    @field_validator("refresh_every", "cooldown")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be more than 0 seconds")
        return value

    @classmethod
    def from_config(
        cls,
        data: Mapping[str, Any] | list[str] | None,
        *,
        file: str | None = None,
        key: str = "proxies",
    ) -> ProxyConfig:
        """Validate a ``proxies`` mapping (or a bare list of proxy URLs); a bad entry is a
        ``ConfigError`` naming its key, e.g. ``proxies.urls.1``."""
        try:
            return cls.model_validate(data if isinstance(data, list) else dict(data or {}))
        except ValidationError as exc:
            raise config_error(exc, file=file, prefix=key) from None


class ProxyPool:
    """Rotating proxies with retirement.

    ``pick()`` returns the next proxy not retired (``None`` when the pool is empty or all
    are retired: check ``configured`` to tell "no proxies" from "none left"). ``retire``
    takes one out for ``cooldown`` seconds of the injected ``clock``. ``refresh`` re-reads
    the provider URL (the Downloader calls ``maybe_refresh`` before picking). ``stats``
    counts picks and retirements per proxy (credentials masked).
    """

    def __init__(
        self,
        proxies: Iterable[str] = (),
        *,
        provider_url: str | None = None,
        refresh_every: float = 300.0,
        cooldown: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._static = [_check_proxy(p) for p in proxies]
        self.provider_url = provider_url
        self.refresh_every = refresh_every
        self.cooldown = cooldown
        self._clock = clock
        self._proxies: list[str] = list(dict.fromkeys(self._static))
        self._cursor = 0
        self._retired: dict[str, float] = {}  # proxy -> back at (clock)
        self._next_refresh = float("-inf") if provider_url else float("inf")
        self._refreshing: asyncio.Future[None] | None = None
        self.picks: dict[str, int] = {}
        self.retirements: dict[str, int] = {}
        self.refreshes = 0
        self.refresh_errors = 0
        self.last_refresh_error = ""

    @classmethod
    def from_config(
        cls, config: ProxyConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> ProxyPool:
        return cls(
            config.urls,
            provider_url=config.provider_url,
            refresh_every=config.refresh_every,
            cooldown=config.cooldown,
            clock=clock,
        )

    @property
    def configured(self) -> bool:
        """True when requests should go through a proxy (a list or a provider is set)."""
        return bool(self._static) or self.provider_url is not None

    @property
    def proxies(self) -> list[str]:
        """Every proxy the pool knows now, retired or not."""
        return list(self._proxies)

    def available(self) -> list[str]:
        """The proxies not retired now."""
        now = self._clock()
        return [p for p in self._proxies if self._retired.get(p, now) <= now]

    def pick(self, exclude: Collection[str] = ()) -> str | None:
        """The next proxy in rotation that is not retired and not in ``exclude``."""
        proxies = self._proxies
        n = len(proxies)
        if not n:
            return None
        retired = self._retired
        now = self._clock() if retired else 0.0
        for _ in range(n):
            proxy = proxies[self._cursor % n]
            self._cursor = (self._cursor + 1) % n
            if retired:
                back = retired.get(proxy)
                if back is not None:
                    if back > now:
                        continue
                    del retired[proxy]
            if proxy in exclude:
                continue
            self.picks[proxy] = self.picks.get(proxy, 0) + 1
            return proxy
        return None

    def retire(self, proxy: str, cooldown: float | None = None) -> None:
        """Take ``proxy`` out of rotation for ``cooldown`` seconds (the pool's default)."""
        self._retired[proxy] = self._clock() + (self.cooldown if cooldown is None else cooldown)
        self.retirements[proxy] = self.retirements.get(proxy, 0) + 1

    def is_retired(self, proxy: str) -> bool:
        back = self._retired.get(proxy)
        return back is not None and back > self._clock()

    def set_proxies(self, proxies: Iterable[str]) -> None:
        """Replace the rotation with the static list plus ``proxies`` (retirements kept)."""
        self._proxies = list(dict.fromkeys([*self._static, *proxies]))
        known = set(self._proxies)
        self._retired = {p: t for p, t in self._retired.items() if p in known}

    def due_refresh(self) -> bool:
        return self._clock() >= self._next_refresh

    @property
    def refreshing(self) -> bool:
        """True while a provider refresh started by ``maybe_refresh`` is under way."""
        return self._refreshing is not None

    async def maybe_refresh(self, session: aiohttp.ClientSession) -> None:
        """Re-read the provider when ``refresh_every`` has passed (cheap check otherwise).

        Concurrent callers share one refresh: the caller that starts it waits for it, and
        so does any caller while the pool has no proxy yet (the first requests of a run);
        the others go on with the current list.
        """
        task = self._refreshing
        if task is None:
            if self._clock() < self._next_refresh:
                return
            task = self._refreshing = asyncio.ensure_future(self.refresh(session))
            task.add_done_callback(self._refreshed)
        elif self._proxies:
            return
        await asyncio.shield(task)

    def _refreshed(self, task: asyncio.Future[None]) -> None:
        self._refreshing = None
        if not task.cancelled() and task.exception() is not None:
            self.refresh_errors += 1
            self.last_refresh_error = f"proxy provider: {task.exception()!r:.200}"

    async def refresh(self, session: aiohttp.ClientSession, timeout: float = 10.0) -> None:
        """Read the provider URL: one proxy URL per line (blank lines and ``#`` comments
        skipped, bad lines ignored and counted). On failure the old list stays and the next
        try is after ``refresh_every`` too; ``last_refresh_error`` says why."""
        if self.provider_url is None:
            return
        import aiohttp

        self._next_refresh = self._clock() + self.refresh_every
        try:
            async with session.get(
                self.provider_url, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status != 200:
                    raise ValueError(f"answered HTTP {resp.status}")
                text = await resp.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.refresh_errors += 1
            self.last_refresh_error = (
                f"proxy provider {redact_url(self.provider_url)}: {exc!r:.200}"
            )
            return
        found = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "://" not in line:
                line = "http://" + line
            try:
                found.append(_check_proxy(line))
            except ValueError:
                self.refresh_errors += 1
        self.set_proxies(found)
        self.refreshes += 1

    def stats(self) -> dict[str, Any]:
        """Namespaced counters: ``proxies/known``, ``proxies/available``, ``proxies/retired``,
        ``proxies/refreshes``, ``proxies/refresh_errors`` and per proxy
        ``proxies/picks/<proxy>`` and ``proxies/retirements/<proxy>`` (credentials masked)."""
        available = len(self.available())
        out: dict[str, Any] = {
            "proxies/known": len(self._proxies),
            "proxies/available": available,
            "proxies/retired": len(self._proxies) - available,
            "proxies/refreshes": self.refreshes,
            "proxies/refresh_errors": self.refresh_errors,
        }
        for proxy, n in self.picks.items():
            out[f"proxies/picks/{redact_url(proxy)}"] = n
        for proxy, n in self.retirements.items():
            out[f"proxies/retirements/{redact_url(proxy)}"] = n
        return out


__all__ = ["ProxyConfig", "ProxyPool"]

"""The domain gate's store on Redis (distributed mode): per domain a sorted set of slot
leases and a pace hash, per origin a robots.txt hash; every step one Lua script that
gets ``now`` from the caller (:mod:`crawlhub.core.clock`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crawlhub.agents.politeness.base import (
    DomainFigures,
    DomainRules,
    Grant,
    Release,
    RobotsEntry,
)
from crawlhub.backends.backend import Backend
from crawlhub.backends.redis import lua, redis_client
from crawlhub.core.keys import DEFAULT_PREFIX, agent_keys

_ACQUIRE = lua(__package__, "acquire.lua")

_RELEASE = lua(__package__, "release.lua")

_EXTEND = lua(__package__, "extend.lua")

_CLAIM = lua(__package__, "claim.lua")


class RedisGateStore:
    """:class:`~crawlhub.agents.politeness.base.GateStore` on a Redis/Valkey server."""

    def __init__(self, url: str | Backend, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.url = str(url)
        self._redis = redis_client(url, name="domain gate")
        keys = agent_keys(prefix)
        self._domain = keys["domain"]
        self._robots = keys["robots"]
        self._adaptive = keys["adaptive"]
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._release = self._redis.register_script(_RELEASE)
        self._claim = self._redis.register_script(_CLAIM)
        self._extend = self._redis.register_script(_EXTEND)

    async def acquire(self, domain: str, n: int, now: float, rules: DomainRules,
                      token: str) -> Grant:
        stem = self._domain + domain
        ids, wait, reason = await self._acquire(
            keys=[f"{stem}:slots", f"{stem}:pace", f"{stem}:adapt"],
            args=[repr(now), n, rules.concurrency, repr(rules.delay), repr(rules.lease),
                  token, "1" if rules.adaptive else "0", rules.start])
        text = ids.decode() if isinstance(ids, bytes) else str(ids)
        why = reason.decode() if isinstance(reason, bytes) else str(reason)
        return Grant(text.split(",") if text else [], float(wait), why)

    async def release(self, releases: Sequence[Release], now: float) -> None:
        if not releases:
            return
        args: list[str] = [repr(now)]
        for r in releases:
            args += [r.domain, r.slot, "" if r.backoff_until is None else repr(r.backoff_until)]
            fb, rules = r.feedback, r.rules
            if fb is None or rules is None or not rules.adaptive:
                args += ["", "", "", "", "", "", ""]
            else:
                args += ["" if fb.latency is None else repr(fb.latency),
                         "1" if fb.overloaded else "0", str(rules.concurrency),
                         str(rules.start), repr(rules.tolerance), repr(rules.delay),
                         repr(rules.max_delay)]
        await self._release(keys=[self._domain, self._adaptive], args=args)

    async def extend(self, slots: Sequence[tuple[str, str, float]], now: float) -> int:
        if not slots:
            return 0
        args: list[str] = [repr(now)]
        for domain, slot, until in slots:
            args += [domain, slot, repr(until)]
        return int(await self._extend(keys=[self._domain], args=args))

    async def reset(self) -> None:
        # Only this prefix's domain keys; SCAN, not KEYS, so the server is not blocked.
        # (what adaptive domains learned of their servers stays: it is no claim of a run)
        keys = [k async for k in self._redis.scan_iter(match=f"{self._domain}*", count=1000)
                if not (k.endswith(b":adapt") if isinstance(k, bytes) else
                        str(k).endswith(":adapt"))]
        for start in range(0, len(keys), 500):
            await self._redis.delete(*keys[start:start + 500])
        # robots.txt claims go, the files stay (a hash holding only a claim goes with it)
        async for key in self._redis.scan_iter(match=f"{self._robots}*", count=1000):
            await self._redis.hdel(key, "claim")

    async def held(self, domain: str, now: float) -> int:
        return int(await self._redis.zcount(f"{self._domain}{domain}:slots",
                                            f"({now!r}", "+inf"))

    async def figures(self, now: float, limit: int = 100) -> list[DomainFigures]:
        domains = [d.decode() if isinstance(d, bytes) else str(d) for d in
                   await self._redis.zrevrange(self._adaptive, 0, max(0, limit - 1))]
        if not domains:
            return []
        fields = ["limit", "delay", "latency", "base", "error_rate", "ok", "errors",
                  "updated"]
        async with self._redis.pipeline(transaction=False) as pipe:
            for d in domains:
                stem = self._domain + d
                pipe.hmget(f"{stem}:adapt", fields)
                pipe.zcount(f"{stem}:slots", f"({now!r}", "+inf")
                pipe.hget(f"{stem}:pace", "backoff")
            answers = await pipe.execute()
        out = []
        for i, d in enumerate(domains):
            values, held, backoff = answers[3 * i:3 * i + 3]
            if values[0] is None:  # expired meanwhile
                continue
            lim, delay, lat, base, err, ok, errors, updated = (float(v or 0) for v in values)
            out.append(DomainFigures(d, lim, delay, lat, base, err, int(ok), int(errors),
                                     int(held), max(0.0, float(backoff or 0) - now), updated))
        return out

    async def robots_get(self, origin: str) -> RobotsEntry | None:
        values: list[Any] = await self._redis.hmget(self._robots + origin,
                                                    ["status", "body", "expires"])
        status, body, expires = values
        if status is None:
            return None
        return RobotsEntry(status=int(status), body=bytes(body or b""), expires=float(expires))

    async def robots_claim(self, origin: str, now: float, until: float) -> bool:
        return bool(await self._claim(keys=[self._robots + origin],
                                      args=[repr(now), repr(until)]))

    async def robots_put(self, origin: str, entry: RobotsEntry, now: float) -> None:
        key = self._robots + origin
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"status": entry.status, "body": entry.body,
                                    "expires": repr(entry.expires), "claim": "0"})
            pipe.expire(key, max(1, int(entry.expires - now)) + 86400)
            await pipe.execute()

    async def close(self) -> None:
        await self._redis.aclose()

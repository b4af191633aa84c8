"""Hub state on Redis (distributed mode): every hub process shares the ledger, counters,
leases and token buckets; every multi-key step is one Lua script."""

from __future__ import annotations

from collections.abc import Sequence

from crawlhub.backends.backend import Backend
from crawlhub.backends.redis import lua, redis_client
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.keys import DEFAULT_PREFIX, hub_keys
from crawlhub.hub.state.base import (
    CLAIM_LEASE,
    DEFAULT_RETENTION,
    RATE_KEEP,
    LedgerEntry,
    Settle,
    _dumps,
    _loads,
)
from crawlhub.hub.state.intake import RedisIntake

_CLAIM_LUA = lua(__package__, "claim.lua")

_END_LEASES_LUA = lua(__package__, "end_leases.lua")

_SETTLE_LUA = lua(__package__, "settle.lua")

_RECORD_LUA = lua(__package__, "record.lua")

_RESOLVE_LUA = lua(__package__, "resolve.lua")

_TOKENS_LUA = lua(__package__, "tokens.lua")


class RedisHubState(RedisIntake):
    """Hub state on Redis (distributed mode): every hub process shares it."""

    def __init__(self, url: str | Backend, *, prefix: str = DEFAULT_PREFIX,
                 retention: float = DEFAULT_RETENTION,
                 clock: Clock | None = None) -> None:
        self.url = str(url)
        self.retention = retention
        #: Epoch seconds for retention and token buckets (crawlhub.core.clock: the caller's,
        #: never the server's); tests pass a fake one.
        self.clock: Clock = clock or system_clock
        self._redis = redis_client(url, name="hub state")
        self._keys = hub_keys(prefix)
        self._resp_cache = {}
        self._prefix = prefix
        self._record = self._redis.register_script(_RECORD_LUA)
        self._claim = self._redis.register_script(_CLAIM_LUA)
        self._end_leases = self._redis.register_script(_END_LEASES_LUA)
        self._settle = self._redis.register_script(_SETTLE_LUA)
        self._resolve = self._redis.register_script(_RESOLVE_LUA)
        self._tokens = self._redis.register_script(_TOKENS_LUA)

    @property
    def _ledger_keys(self) -> list[str]:
        k = self._keys
        return [k["ledger"], k["deadlines"], k["retention"]]

    async def record(self, entries: Sequence[LedgerEntry],
                     counters: Sequence[tuple[str, str, int]] = ()) -> None:
        if not entries:
            await self.incr_many(counters)
            return
        ids = [str(e.task["task_uuid"]).encode() for e in entries]
        blobs = [_dumps(e).encode() for e in entries]
        args: list[bytes | str | int] = [
            b"".join(ids), ",".join(str(len(i)) for i in ids),
            b"".join(blobs), ",".join(str(len(b)) for b in blobs),
            ",".join("" if e.deadline is None else repr(e.deadline) for e in entries),
            repr(self.clock() + self.retention),
        ]
        for outbound, field, n in counters:
            args += [f"{outbound}\x1f{field}", n]
        await self._record(keys=[*self._ledger_keys, self._keys["counters"]], args=args)

    async def get(self, task_uuid: str) -> LedgerEntry | None:
        raw = await self._redis.hget(self._keys["ledger"], task_uuid)
        return _loads(raw) if raw else None

    async def resolve(self, task_uuid: str) -> LedgerEntry | None:
        raw = await self._resolve(keys=self._ledger_keys, args=[task_uuid])
        return _loads(raw) if raw else None

    async def claim_expired(self, now: float, limit: int = 500, *,
                            lease: float = CLAIM_LEASE) -> list[LedgerEntry]:
        k = self._keys
        out = await self._claim(keys=[*self._ledger_keys, k["leases"], k["pending"]],
                                args=[repr(now), limit, repr(now + lease)])
        return [_loads(out[i + 1], out[i]) for i in range(0, len(out), 2)]

    async def end_leases(self, now: float) -> int:
        return int(await self._end_leases(keys=[self._keys["leases"]], args=[repr(now)]))

    async def get_many(self, task_uuids: Sequence[str]) -> dict[str, LedgerEntry]:
        uuids = list(dict.fromkeys(task_uuids))
        if not uuids:
            return {}
        raws = await self._redis.hmget(self._keys["ledger"], uuids)
        return {u: _loads(raw) for u, raw in zip(uuids, raws, strict=True) if raw}

    async def settle(self, current: LedgerEntry, after: LedgerEntry | None,
                     counters: Sequence[tuple[str, str, int]] = (), *,
                     lease_until: float = 0.0) -> bool:
        [done] = await self.settle_many([Settle(current, after, counters, lease_until)])
        return done

    async def settle_many(self, items: Sequence[Settle]) -> list[bool]:
        """One pipeline (one round trip) of one settle script per item: each script is
        atomic on its own, so each item is applied or skipped alone."""
        if not items:
            return []
        expires = repr(self.clock() + self.retention)
        k = self._keys
        keys = [*self._ledger_keys, k["leases"], k["pending"], k["counters"], k["unpushed"]]
        raws: list[str | bytes] = []
        async with self._redis.pipeline(transaction=False) as pipe:
            for item in items:
                current, after = item.current, item.after
                if current.raw is None:
                    raise ValueError("settle needs an entry read from the ledger"
                                     " (get/claim_expired)")
                raw: str | bytes = "" if after is None else after.raw or _dumps(after)
                raws.append(raw)
                args: list[str | bytes | int] = [
                    str(current.task["task_uuid"]), current.raw, raw,
                    "" if after is None or after.deadline is None else repr(after.deadline),
                    "" if after is None else after.pending or "",
                    repr(item.lease_until), expires,
                ]
                for outbound, name, n in item.counters:
                    args += [f"{outbound}\x1f{name}", n]
                await self._settle(keys=keys, args=args, client=pipe)
            results = await pipe.execute()
        done = [bool(r) for r in results]
        for item, raw, ok in zip(items, raws, done, strict=True):
            if ok and item.after is not None:
                item.after.raw = raw
        return done

    async def note_dispatched(self, counts: Sequence[tuple[str, int, int]]) -> None:
        if not counts:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for outbound, second, n in counts:
                key = f"{self._keys['rate']}{second}"
                pipe.hincrby(key, outbound, n)
                pipe.expire(key, RATE_KEEP)
            await pipe.execute()

    async def dispatched_in(self, first: int, last: int) -> dict[str, int]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for s in range(max(first, last - RATE_KEEP), last + 1):
                pipe.hgetall(f"{self._keys['rate']}{s}")
            buckets = await pipe.execute()
        total: dict[str, int] = {}
        for bucket in buckets:
            for key, value in bucket.items():
                name = key.decode() if isinstance(key, bytes) else str(key)
                total[name] = total.get(name, 0) + int(value)
        return total

    async def incr(self, outbound: str, field: str, n: int = 1) -> None:
        await self._redis.hincrby(self._keys["counters"], f"{outbound}\x1f{field}", n)

    async def incr_many(self, items: Sequence[tuple[str, str, int]]) -> None:
        if not items:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for outbound, field, n in items:
                pipe.hincrby(self._keys["counters"], f"{outbound}\x1f{field}", n)
            await pipe.execute()

    async def counters(self) -> dict[str, dict[str, int]]:
        raw = await self._redis.hgetall(self._keys["counters"])
        result: dict[str, dict[str, int]] = {}
        for key, value in raw.items():
            text = key.decode() if isinstance(key, bytes) else str(key)
            outbound, _, field = text.partition("\x1f")
            result.setdefault(outbound, {})[field] = int(value)
        return result

    async def take_tokens(self, scope: str, rate: float, n: int, burst: float) -> float:
        now = repr(self.clock())
        wait = await self._tokens(keys=[f"{self._keys['tokens']}:{scope}"],
                                  args=[rate, n, burst, now])
        return float(wait)

    async def pending(self) -> int:
        return int(await self._redis.hlen(self._keys["ledger"]))

    async def close(self) -> None:
        await self._redis.aclose()

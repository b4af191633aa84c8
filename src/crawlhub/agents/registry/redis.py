"""The agent registry on Redis (distributed mode): registrations and last heartbeats in
two hashes, last signs of life in a sorted set, so the live agents are one range read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crawlhub.agents.registry.base import (
    DEFAULT_DEAD_AFTER,
    DEFAULT_RETENTION,
    AgentInfo,
    AgentStatus,
    Heartbeat,
)
from crawlhub.backends.backend import Backend
from crawlhub.backends.redis import lua, redis_client
from crawlhub.core import jsoncodec, rejects
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.keys import DEFAULT_PREFIX, agent_keys
from crawlhub.core.signing import MAX_SKEW

_FORGET = lua(__package__, "forget.lua")

_BEAT = lua(__package__, "beat.lua")

_LIST = _FORGET.replace("return #old", "") + lua(__package__, "list.lua")


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


class RedisAgentRegistry:
    """:class:`~crawlhub.agents.registry.base.AgentRegistry` on a Redis/Valkey server."""

    def __init__(self, url: str | Backend, *, prefix: str = DEFAULT_PREFIX,
                 dead_after: float = DEFAULT_DEAD_AFTER,
                 retention: float = DEFAULT_RETENTION, clock: Clock = system_clock) -> None:
        self.url = str(url)
        self.dead_after = dead_after
        self.retention = retention
        self.clock = clock
        self._redis = redis_client(url, name="agent registry")
        k = agent_keys(prefix)
        self._keys = [k["info"], k["beat"], k["seen"]]
        self._forget = self._redis.register_script(_FORGET)
        self._beat = self._redis.register_script(_BEAT)
        self._list = self._redis.register_script(_LIST)
        self._reported = rejects.Once()

    def _status(self, info: Any, beat: Any, seen: Any, now: float,
                agent_id: str = "") -> AgentStatus | None:
        """The agent's status, or None (counted, logged once) when its stored entry is
        not one - not JSON, fields of the wrong type, a last sign of life in the future:
        written by something other than crawlhub. One bad entry never hides the others."""
        try:
            last = float(seen)
            if last - now > MAX_SKEW:
                raise _Refused(rejects.SKEW, f"last seen {last - now:.0f} s in the future")
            data = jsoncodec.loads(info)
            status = AgentStatus(
                info=AgentInfo.from_dict(data),
                beat=None if beat is None else Heartbeat.from_dict(jsoncodec.loads(beat)),
                last_seen=last, alive=now - last < self.dead_after)
        except _Refused as exc:
            self._rejected(agent_id, exc.reason, str(exc), (info, beat, seen))
            return None
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            self._rejected(agent_id, rejects.MALFORMED, f"{type(exc).__name__}: {exc}",
                           (info, beat, seen))
            return None
        return status

    def _rejected(self, agent_id: str, reason: str, detail: str, entry: Any) -> None:
        if not self._reported.first((agent_id, reason, hash(entry))):
            return  # read on every sync: counted and logged once
        rejects.rejected("agents:registry", agent_id, reason,
                         f"{self._keys[0]}: {detail}; left in place, skipped")

    async def register(self, info: AgentInfo, *, at: float | None = None) -> None:
        now = self.clock() if at is None else at
        info_key, beat_key, seen_key = self._keys
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(info_key, info.agent_id, jsoncodec.dumps(info.as_dict()))
            pipe.hdel(beat_key, info.agent_id)
            # a stamped registration never moves the last sign of life back
            pipe.zadd(seen_key, {info.agent_id: now}, gt=at is not None)
            await pipe.execute()

    async def heartbeat(self, agent_id: str, beat: Heartbeat) -> bool:
        return (await self.heartbeat_many([(agent_id, beat)]))[0]

    async def heartbeat_many(self, beats: Sequence[tuple[str, Heartbeat]], *,
                             at: Sequence[float] | None = None) -> list[bool]:
        if not beats:
            return []
        now = repr(self.clock())
        args: list[str] = []
        for n, (agent_id, beat) in enumerate(beats):
            args += [agent_id, jsoncodec.dumps(beat.as_dict()),
                     now if at is None else repr(float(at[n]))]
        return [bool(x) for x in await self._beat(keys=self._keys, args=args)]

    async def unregister(self, agent_id: str) -> bool:
        info_key, beat_key, seen_key = self._keys
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(info_key, agent_id)
            pipe.hdel(beat_key, agent_id)
            pipe.zrem(seen_key, agent_id)
            dropped, _, _ = await pipe.execute()
        return bool(dropped)

    async def get(self, agent_id: str) -> AgentStatus | None:
        now = self.clock()
        info_key, beat_key, seen_key = self._keys
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hget(info_key, agent_id)
            pipe.hget(beat_key, agent_id)
            pipe.zscore(seen_key, agent_id)
            info, beat, seen = await pipe.execute()
        if info is None or seen is None:
            return None
        return self._status(info, beat, seen, now, agent_id)

    async def agents(self) -> list[AgentStatus]:
        now = self.clock()
        cutoff = now - self.dead_after - self.retention
        infos, beats, seen = await self._list(keys=self._keys, args=[repr(cutoff)])
        info_by_id, beat_by_id, seen_by_id = _pairs(infos), _pairs(beats), _pairs(seen)
        out = [self._status(info_by_id[i], beat_by_id.get(i), seen_by_id[i], now, i)
               for i in sorted(info_by_id) if i in seen_by_id]
        return [status for status in out if status is not None]

    async def live(self) -> list[str]:
        since = self.clock() - self.dead_after
        ids = await self._redis.zrangebyscore(self._keys[2], f"({since!r}", "+inf")
        return sorted(_text(i) for i in ids)

    async def forget_dead(self) -> int:
        cutoff = self.clock() - self.dead_after - self.retention
        return int(await self._forget(keys=self._keys, args=[repr(cutoff)]))

    async def close(self) -> None:
        await self._redis.aclose()

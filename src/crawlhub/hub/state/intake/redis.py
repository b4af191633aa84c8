"""The intake ledger on the hub's Redis: unpushed records, owners' heartbeats and frontier
gates, one Lua script per step; on a server that also holds the outbound queues the
record and the push are one script (mixed into ``RedisHubState``)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from typing import Any

from crawlhub.backends.redis import lua, write_commands
from crawlhub.hub.state.intake.base import Intake, QueueGroup

_BEGIN = lua(__package__, "split.lua", "begin.lua")

_COMMIT = lua(__package__, "split.lua", "commit.lua")

_ABORT = lua(__package__, "split.lua", "abort.lua")

_CLAIM = lua(__package__, "claim.lua")


def _push_script() -> str:
    from crawlhub.queues.redis import PUSH_ROWS_LUA

    return lua(__package__, "split.lua") + PUSH_ROWS_LUA + lua(__package__, "push.lua")


#: A record field's length in the push script's blob (push.lua: ``struct`` ``<I4``).
_U32 = struct.Struct("<I").pack


def _packed(parts: Sequence[str | bytes]) -> tuple[bytes, str]:
    blobs = [p if isinstance(p, bytes) else p.encode() for p in parts]
    return b"".join(blobs), ",".join(str(len(b)) for b in blobs) or ""


class RedisIntake:
    """Intake ledger on the hub's Redis (mixed into ``RedisHubState``); on a server that
    also holds the outbound queues, :meth:`intake_push` records and pushes in one script."""

    _redis: Any
    _keys: dict[str, str]
    retention: float
    _intake_scripts: dict[str, Any] | None = None
    #: the push script's str arguments in Redis's protocol (``pack_command``)
    _resp_cache: dict[str, bytes]

    def _script(self, name: str) -> Any:
        if self._intake_scripts is None:
            self._intake_scripts = {
                n: self._redis.register_script(text) for n, text in
                (("begin", _BEGIN), ("commit", _COMMIT), ("abort", _ABORT), ("claim", _CLAIM),
                 ("push", _push_script()))}
        return self._intake_scripts[name]

    async def intake_beat(self, owner: str, now: float) -> None:
        await self._redis.zadd(self._keys["alive"], {owner: now})

    async def intake_begin(self, items: Sequence[Intake], now: float, owner: str
                           ) -> list[str]:
        k = self._keys
        ids, id_lens = _packed([i.uuid for i in items])
        entries, entry_lens = _packed([i.entry_bytes() for i in items])
        gates, gate_lens = _packed([i.gate or "" for i in items])
        flags = await self._script("begin")(
            keys=[k["ledger"], k["retention"], k["unpushed"], k["gates"], k["owners"],
                  k["alive"]],
            args=[repr(now), owner, repr(now + self.retention), ids, id_lens, entries,
                  entry_lens, gates, gate_lens])
        text = flags.decode() if isinstance(flags, bytes) else str(flags)
        return list(text)

    async def intake_free(self, items: Sequence[Intake]) -> list[bool]:
        """One round trip: True where the item's uuid is not in the ledger and its gate
        has no field (nobody holds it, nobody released it untaken)."""
        if not items:
            return []
        k = self._keys
        gated = [i.gate for i in items if i.gate]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(k["ledger"], [i.uuid for i in items])
            if gated:
                pipe.hmget(k["gates"], gated)
            replies = await pipe.execute()
        held = iter(replies[1] if gated else ())
        out = []
        for item, entry in zip(items, replies[0], strict=True):
            gate_free = next(held) is None if item.gate else True
            out.append(entry is None and gate_free)
        return out

    async def intake_commit(self, items: Sequence[Intake],
                            counters: Sequence[tuple[str, str, int]] = ()) -> None:
        k = self._keys
        ids, id_lens = _packed([i.uuid for i in items])
        gates, gate_lens = _packed([i.gate or "" for i in items])
        deadlines = ",".join("" if i.deadline is None else repr(i.deadline) for i in items)
        args: list[Any] = [ids, id_lens, deadlines, gates, gate_lens]
        for outbound, field, n in counters:
            args += [f"{outbound}\x1f{field}", n]
        await self._script("commit")(
            keys=[k["ledger"], k["deadlines"], k["unpushed"], k["gates"], k["counters"],
                  k["owners"]],
            args=args)

    async def intake_abort(self, items: Sequence[Intake], *, release: bool) -> None:
        k = self._keys
        ids, id_lens = _packed([i.uuid for i in items])
        gates, gate_lens = _packed([i.gate or "" for i in items])
        await self._script("abort")(
            keys=[k["ledger"], k["retention"], k["unpushed"], k["gates"], k["owners"]],
            args=[ids, id_lens, gates, gate_lens, "1" if release else "0"])

    async def intake_claim(self, now: float, dead_before: float, owner: str,
                           limit: int = 500) -> list[Intake]:
        k = self._keys
        raws = await self._script("claim")(
            keys=[k["ledger"], k["unpushed"], k["gates"], k["owners"], k["alive"]],
            args=[repr(now), repr(dead_before), owner, limit])
        out = []
        for i in range(0, len(raws), 2):
            intake = Intake.loads(raws[i])
            intake.inherited = raws[i + 1] in (b"1", "1")
            out.append(intake)
        return out

    def _push_call(self, mode: str, items: Sequence[tuple[Intake, int, bytes | str, int]],
                   groups: Sequence[QueueGroup], registry: str, now: float
                   ) -> tuple[list[str], list[Any]]:
        """The push script's keys and arguments: the tasks as one blob of records (see
        push.lua), which Lua reads with one ``struct.unpack`` per task."""
        k = self._keys
        keys = [k["ledger"], k["deadlines"], k["retention"], k["unpushed"], k["gates"],
                k["counters"], registry, k["owners"]]
        names: list[str] = []
        for g in groups:
            keys += g.keys
            names += [g.queue, g.outbound, str(g.limit)]
        new = mode == "new"
        parts: list[bytes] = []
        add = parts.extend
        for intake, group, payload, priority in items:
            uuid = intake.uuid.encode()
            entry = intake.entry_bytes() if new else b""
            deadline = b"" if intake.deadline is None else repr(intake.deadline).encode()
            data = payload if isinstance(payload, bytes) else payload.encode()
            prio = b"%d" % priority
            gate = intake.gate.encode() if intake.gate else b""
            add((_U32(len(uuid)), uuid, _U32(len(entry)), entry, _U32(len(deadline)),
                 deadline, _U32(group + 1), _U32(len(data)), data, _U32(len(prio)), prio,
                 _U32(len(gate)), gate))
        args: list[Any] = [mode, repr(now + self.retention).encode(), len(items),
                           b"".join(parts),
                           *names]
        return keys, args

    async def intake_push(self, mode: str,
                          items: Sequence[tuple[Intake, int, bytes | str, int]],
                          groups: Sequence[QueueGroup], registry: str, now: float
                          ) -> list[bool]:
        """One script: ``mode='new'`` records each item whose uuid is new and pushes it;
        ``mode='commit'`` pushes each item :meth:`intake_begin` recorded that is still
        unpushed and marks it pushed. ``items``: (intake, group index, payload JSON,
        priority). Returns per item whether it was pushed."""
        return await (await self.intake_push_sent(mode, items, groups, registry, now))

    async def intake_push_sent(self, mode: str,
                               items: Sequence[tuple[Intake, int, bytes | str, int]],
                               groups: Sequence[QueueGroup], registry: str, now: float
                               ) -> asyncio.Future[list[bool]]:
        """:meth:`intake_push`, returning once the script is on its way to Redis: the
        future gives its answer, so the caller can prepare the next batch meanwhile."""
        keys, args = self._push_call(mode, items, groups, registry, now)
        script = self._script("push")
        replies = await write_commands(
            self._redis, [("EVALSHA", script.sha, len(keys), *keys, *args)], self._resp_cache)
        return asyncio.ensure_future(self._push_reply(replies, script, keys, args))

    async def _push_reply(self, replies: Any, script: Any, keys: list[str], args: list[Any]
                          ) -> list[bool]:
        from redis.exceptions import NoScriptError

        (flags,) = await replies
        if isinstance(flags, NoScriptError):
            # a server that has not seen it yet (it did nothing): load, run
            flags = await script(keys=keys, args=args)
        elif isinstance(flags, Exception):
            raise flags
        text = flags.decode() if isinstance(flags, bytes) else str(flags)
        return [c == "1" for c in text]

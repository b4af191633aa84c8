"""The intake ledger on the hub's Redis: unpushed records, owners' heartbeats and frontier
gates, one Lua script per step; on a server that also holds the outbound queues the
record and the push are one script (mixed into ``RedisHubState``)."""

from __future__ import annotations

import asyncio
import struct
import time
import weakref
from collections.abc import Sequence
from typing import Any

from crawlhub.backends.redis import (
    give_back,
    lua,
    pack_command,
    socket_of,
    take_connection,
    write_on,
)
from crawlhub.hub.state.intake.base import Intake, QueueGroup
from crawlhub.hub.state.intake.ids import BLOCK_TTL, QueueIds

#: Connections the MULTI pushes keep between pushes (one per chunk in flight: a batch's
#: chunks overlap, and concurrent batches each take their own).
HELD = 8

_BEGIN = lua(__package__, "split.lua", "begin.lua")

_COMMIT = lua(__package__, "split.lua", "commit.lua")

_ABORT = lua(__package__, "split.lua", "abort.lua")

_CLAIM = lua(__package__, "claim.lua")


def _push_script() -> str:
    from crawlhub.queues.redis import PUSH_ROWS_LUA

    return lua(__package__, "split.lua") + PUSH_ROWS_LUA + lua(__package__, "push.lua")


#: A record field's length in the push script's blob (push.lua: ``struct`` ``<I4``).
_U32 = struct.Struct("<I").pack


def _bulk(value: bytes) -> bytes:
    """``value`` as one bulk string of Redis's protocol (RESP)."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


_HEADS: dict[tuple[bytes, str], bytes] = {}


def _command(name: bytes, key: str, argc: int) -> bytes:
    """The head of a command of ``argc`` arguments after its key, in RESP."""
    head = _HEADS.get((name, key))
    if head is None:
        head = _bulk(name) + _bulk(key.encode())
        if len(_HEADS) < 10_000:
            _HEADS[name, key] = head
    return b"*%d\r\n%b" % (argc + 2, head)


_MULTI, _EXEC = b"*1\r\n$5\r\nMULTI\r\n", b"*1\r\n$4\r\nEXEC\r\n"
_ZERO, _TOTAL = _bulk(b"0"), _bulk(b"total")


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
    #: the blocks of queue ids this process holds, by the queue's ``seq`` key (ids.py)
    _queue_ids: dict[str, QueueIds] | None = None
    #: each queue group's fixed parts of the MULTI push (_heads)
    _group_heads: dict[tuple[Any, ...], tuple[bytes, ...]] | None = None
    #: the socket each connection of the pool had when this process last pushed on it
    _sockets: weakref.WeakKeyDictionary[Any, Any] | None = None
    #: connections the MULTI pushes gave back, kept for the next (see _take)
    _held: list[Any] | None = None

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
                               groups: Sequence[QueueGroup], registry: str, now: float,
                               *, fresh: bool = False) -> asyncio.Future[list[bool]]:
        """:meth:`intake_push`, returning once the script is on its way to Redis: the
        future gives its answer, so the caller can prepare the next batch meanwhile.

        ``fresh`` (mode ``new``): this process drew every item's uuid for this push, so
        no ledger holds any of them. Then, while the process holds enough queue ids
        (ids.py), the push is plain commands in one ``MULTI``/``EXEC``, atomic as the
        script is and about half its work on the server (no Lua, no lookup of the uuids);
        the script's pushes ask for those ids in the same write."""
        if self._queue_ids is None:
            self._queue_ids = {}
        clock = time.monotonic()
        if fresh and mode == "new":
            conn = await self._take()
            try:
                self._check_socket(conn)
                native = self._native_push(items, groups, registry, now, clock)
            except BaseException:
                await give_back(self._redis, conn)
                raise
            if native is None:
                if not self._keep(conn):
                    await give_back(self._redis, conn)
            else:
                packed, n, asked = native
                try:
                    replies = await write_on(self._redis, conn, packed, n, self._keep)
                except BaseException:
                    self._drop_ids()
                    raise
                return asyncio.ensure_future(self._native_reply(replies, len(items), asked))
        keys, args = self._push_call(mode, items, groups, registry, now)
        script = self._script("push")
        commands: list[tuple[Any, ...]] = [("EVALSHA", script.sha, len(keys), *keys, *args)]
        asks: list[tuple[QueueIds, int, int]] = []
        counts = [0] * len(groups)
        for item in items:
            counts[item[1]] += 1
        for group, n in zip(groups, counts, strict=True):
            if not n:
                continue
            ids = self._ids_of(group)
            ids.drop()  # the script takes ids after the blocks held: spend them no more
            if fresh and mode == "new" and (n > 1 or clock - ids.used_at < BLOCK_TTL):
                size = ids.ask(clock)
                asks.append((ids, size, ids.epoch))
                commands.append(("INCRBY", group.keys[4], size))
            ids.used_at = clock
        script_packed: list[bytes] = []
        for command in commands:
            script_packed += pack_command(command, self._resp_cache)
        try:
            replies = await write_on(self._redis, await self._take(), script_packed,
                                     len(commands), self._keep)
        except BaseException:
            for ids, _, epoch in asks:
                ids.lost(epoch)
            raise
        return asyncio.ensure_future(self._push_reply(replies, script, keys, args, asks))

    async def _take(self) -> Any:
        """A connection for a push: one a push gave back (:meth:`_keep`), else one of the
        pool, connected again if it was closed under it. A take and a give back through
        redis-py's pool cost ~8 us of CPU (its lock, its events), a tenth of a chunk's
        fixed cost. The check is the one redis-py's pool skips while its maintenance
        notifications are on (``auto``, the default): after a restart of the server it
        hands out its closed connections as they are, and the push on one fails."""
        held = self._held
        conn = held.pop() if held else await take_connection(self._redis)
        try:
            if not conn.is_connected or await conn.can_read():  # (closed, or dirty)
                await conn.disconnect()
                await conn.connect()
        except BaseException:
            await give_back(self._redis, conn)
            raise
        return conn

    def _keep(self, conn: Any) -> bool:
        """Keep ``conn`` for the next push instead of giving it back (at most HELD, and
        only while connected); False: the caller gives it back."""
        if self._held is None:
            self._held = []
        if len(self._held) >= HELD or not conn.is_connected:
            return False
        self._held.append(conn)
        return True

    def _check_socket(self, conn: Any) -> None:
        """Spend no id held or asked before ``conn`` connected again (or first). A Redis
        server restarted may have lost the ``INCRBY`` that drew them and hand them out
        again; every connection made before the restart reconnects after it, and a
        push takes its ids only once its connection is known to be this one."""
        if self._sockets is None:
            self._sockets = weakref.WeakKeyDictionary()
        sock = socket_of(conn)
        if sock is None or self._sockets.get(conn) is not sock:
            self._sockets[conn] = sock
            self._drop_ids()

    def _drop_ids(self) -> None:
        for ids in (self._queue_ids or {}).values():
            ids.drop()

    def _heads(self, group: QueueGroup) -> tuple[bytes, ...]:
        """A queue group's fixed parts of the MULTI push, in RESP, built once: the ZADD
        of ready, the HSET of payloads and the HSET of priorities (each after the count
        of arguments); the HINCRBY of its stats' total and of its outbound's counter
        (each before the count); the HSET of its delivery limit (or nothing); its name
        for the registry; the INCRBY of its ids (before the size)."""
        if self._group_heads is None:
            self._group_heads = {}
        key = (*group.keys, group.outbound, group.limit, group.queue)
        heads = self._group_heads.get(key)
        if heads is None:
            ready, payloads, priorities, stats, seq = group.keys
            heads = self._group_heads[key] = (
                _bulk(b"ZADD") + _bulk(ready.encode()),
                _bulk(b"HSET") + _bulk(payloads.encode()),
                _bulk(b"HSET") + _bulk(priorities.encode()),
                _command(b"HINCRBY", stats, 2) + _TOTAL,
                _command(b"HINCRBY", self._keys["counters"], 2)
                + _bulk(f"{group.outbound}\x1ftotal".encode()),
                _command(b"HSET", stats, 2) + _bulk(b"max_attempts")
                + _bulk(b"%d" % group.limit) if group.limit > 0 else b"",
                _bulk(group.queue.encode()),
                _command(b"INCRBY", seq, 1))
        return heads

    def _ids_of(self, group: QueueGroup) -> QueueIds:
        assert self._queue_ids is not None
        ids = self._queue_ids.get(group.keys[4])
        if ids is None:
            ids = self._queue_ids[group.keys[4]] = QueueIds()
        return ids

    def _native_push(self, items: Sequence[tuple[Intake, int, bytes | str, int]],
                     groups: Sequence[QueueGroup], registry: str, now: float, clock: float
                     ) -> tuple[list[bytes], int, list[tuple[QueueIds, int, int]]] | None:
        """The push script's ``new`` mode for items no ledger holds, as plain commands in
        one ``MULTI``/``EXEC`` (RESP, the number of replies, the asks for ids made), or
        None when this process lacks the queue ids it needs."""
        per: list[list[tuple[Intake, int, bytes | str, int]]] = [[] for _ in groups]
        for item in items:
            per[item[1]].append(item)
        held = [self._ids_of(g) for g in groups]
        for ids, members in zip(held, per, strict=True):
            if members and ids.available(clock) < len(members):
                return None
        k = self._keys
        expiry = _bulk(repr(now + self.retention).encode())
        ledger: list[bytes] = []
        kept: list[bytes] = []
        timed: list[bytes] = []
        for intake, _, _, _ in items:
            uuid = b"$32\r\n%b\r\n" % intake.task["task_uuid"].encode()
            if len(uuid) != 39:  # (one drawn here is 32 hex digits; frame any other alone)
                uuid = _bulk(intake.uuid.encode())
            entry = intake.entry_bytes()
            ledger += (uuid, b"$%d\r\n" % len(entry), entry, b"\r\n")
            kept += (expiry, uuid)
            if intake.deadline is not None:
                timed += (_bulk(repr(intake.deadline).encode()), uuid)
        n = len(items)
        out = [_MULTI, _command(b"HSET", k["ledger"], 2 * n), *ledger,
               _command(b"ZADD", k["retention"], 2 * n), *kept]
        commands = 3
        if timed:
            out += (_command(b"ZADD", k["deadlines"], len(timed)), *timed)
            commands += 1
        names: list[bytes] = []
        asks: list[tuple[QueueIds, int, int]] = []
        asking: list[bytes] = []
        for group, ids, members in zip(groups, held, per, strict=True):
            m = len(members)
            if not m:
                continue
            heads = self._heads(group)
            scores: list[bytes] = []
            bodies: list[bytes] = []
            prios: list[bytes] = []
            for num, (_, _, payload, priority) in zip(ids.take(m), members, strict=True):
                member = b"$16\r\n%016d\r\n" % num
                data = payload if isinstance(payload, bytes) else payload.encode()
                if priority:
                    scores += (_bulk(b"%d" % -priority), member)
                    prios += (member, _bulk(b"%d" % priority))
                else:  # (priority 0 is no entry in priorities: see queues/redis.py)
                    scores += (_ZERO, member)
                bodies += (member, b"$%d\r\n" % len(data), data, b"\r\n")
            count = _bulk(b"%d" % m)
            argc = b"*%d\r\n" % (2 * m + 2)
            out += (argc, heads[0], *scores, argc, heads[1], *bodies)
            if prios:
                out += (b"*%d\r\n" % (len(prios) + 2), heads[2], *prios)
                commands += 1
            out += (heads[3], count, heads[4], count, heads[5])
            commands += 4 + (group.limit > 0)
            names.append(heads[6])
            ids.used_at = clock
            if not ids.asked and ids.available(clock) < ids.size // 2:
                size = ids.ask(clock)
                asks.append((ids, size, ids.epoch))
                asking += (heads[7], _bulk(b"%d" % size))
        # the asks last: their answers are the transaction's last (_native_reply)
        out += (_command(b"SADD", registry, len(names)), *names, *asking, _EXEC)
        commands += 2 + len(asks)
        return out, commands, asks

    async def _native_reply(self, replies: Any, n: int,
                            asks: list[tuple[QueueIds, int, int]]) -> list[bool]:
        try:
            answers = await replies
            for answer in answers:
                if isinstance(answer, Exception):
                    raise answer  # (EXECABORT: nothing was done)
            done = answers[-1]
            if not isinstance(done, list) or len(done) < len(asks):
                # (only a WATCH aborts one, and none is set)
                from redis.exceptions import ResponseError

                raise ResponseError(f"the push's transaction answered {done!r}")
            pushed, given = done[:len(done) - len(asks)], done[len(done) - len(asks):]
            for result in pushed:
                if isinstance(result, Exception):
                    raise result
        except BaseException:
            self._drop_ids()  # (whatever happened to the server, draw afresh)
            raise
        for (ids, size, epoch), last in zip(asks, given, strict=True):
            # an ask that failed (its seq key not a number) costs its ids, not the push
            if isinstance(last, int) and not isinstance(last, bool):
                ids.got(last, size, epoch)
            else:
                ids.lost(epoch)
        return [True] * n

    async def _push_reply(self, replies: Any, script: Any, keys: list[str], args: list[Any],
                          asks: Sequence[tuple[QueueIds, int, int]] = ()) -> list[bool]:
        from redis.exceptions import NoScriptError

        try:
            flags, *given = await replies
        except BaseException:
            for ids, _, epoch in asks:
                ids.lost(epoch)
            raise
        for (ids, size, epoch), last in zip(asks, given, strict=True):
            if isinstance(last, Exception):
                ids.lost(epoch)
            else:
                ids.got(int(last), size, epoch)
        if isinstance(flags, NoScriptError):
            # a server that has not seen it yet (it did nothing): load, run; it takes
            # ids after the blocks just drawn, which are then spent no more
            for ids, _, _ in asks:
                ids.drop()
            flags = await script(keys=keys, args=args)
        elif isinstance(flags, Exception):
            raise flags
        text = flags.decode() if isinstance(flags, bytes) else str(flags)
        return [c == "1" for c in text]

"""The distributed seed store: seeds, leases and a shared bloom filter in Redis, moved by
Lua scripts so any number of processes see one frontier.

The bloom filter is plain Redis strings written with ``BITFIELD`` (no RedisBloom module,
whose licence is not open source). Clients hash each key once (xxh3-128) and send two
32-bit halves in one packed argument per batch; the admit script derives the k bit
positions of every layer by double hashing and tests all layers (``GETBIT``, stopping
at the first clear bit). A filter hit is a duplicate; a miss is settled by ``HSETNX``
of the seed record, so two processes never both admit one key, and the admitted seed
is queued and counted in the same atomic step. Setting a new key's k bits costs Redis
more than the rest of its admission, so a second script (set_bits) does it, written
to Redis as soon as admit has its answer: Redis sets the bits while the caller works
on its next batch. Until then (or for good, if the process dies in between) a repeat
of the key misses the filter and HSETNX finds it stored.

Each process also caches the keys the shared filter has answered for (``CACHE_SHARE``):
a repeat it has seen costs no round trip.

Layout (names from :func:`crawlhub.core.keys.frontier_keys`, all in the frontier's slot):

- ``ready`` sorted set of pending seeds, score ``-priority``, member
  ``<seq:016d>|<priority>|<segment>|<key>`` so equal scores pop FIFO.
- ``due``: waiting seeds, score ``ready_at`` in ms; ``leased``: score ``lease_until`` ms.
- ``s:<segment>:seeds``: hash key -> ``<seq>|<priority>|<seed JSON>``, every seed the
  segment admitted (the exact check and the archive); ``s:<segment>:attempts``,
  ``s:<segment>:stats`` (counters), ``s:<segment>:bloom`` (layer sizes and counts) and
  ``s:<segment>:bloom:<i>`` (the bit arrays).
- ``segments``: sorted set of the segments held; ``seq``: the seed counter.

Times are the callers' clocks in integer milliseconds (exact in Lua's doubles).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import struct
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError, RedisError

from crawlhub.backends.backend import Backend
from crawlhub.backends.redis import lua, redis_client
from crawlhub.core.errors import FrontierError
from crawlhub.core.keys import frontier_keys, frontier_segment_key
from crawlhub.core.redact import redact_url
from crawlhub.frontier.bloom import MAX_LAYER_BITS, FixedBloom, layer_plan, split_hash
from crawlhub.frontier.seed import Outcome, Seed
from crawlhub.frontier.sqlite import check_frontier_name
from crawlhub.frontier.store import Entry, SegmentCounts, check_entries, task_uuid_of
from crawlhub.frontier.validators import Validators

T = TypeVar("T")
log = logging.getLogger("crawlhub.frontier")

_BATCH = 1000
#: Share of the ``fp_rate`` budget given to each process's cache of keys the shared
#: filter has answered for (admitted or found). A key in the cache is present in the
#: shared filter too (its bits are never cleared), unless the cache is wrong (a false
#: positive of its own): so the shared filter is planned at the rest of the budget and
#: the two together stay under ``fp_rate``. About 3 bytes per cached key.
CACHE_SHARE = 0.01
#: Keys cached per segment at most; beyond, keys go to Redis as they come.
CACHE_MAX = 4_000_000
#: set_bits scripts in flight at most before admit waits for Redis to catch up.
_SETTERS_MAX = 4
_COUNTERS = ("admitted", "duplicates", "pending", "leased", "done", "failed", "dispatched")

_PRELUDE = lua(__package__, "prelude.lua")

_FILTER = lua(__package__, "filter.lua")

_ADMIT = lua(__package__, "admit.lua")

_SET_BITS = lua(__package__, "set_bits.lua")

_CLAIM = lua(__package__, "claim.lua")

_EXTEND = lua(__package__, "extend.lua")

_RELEASE = lua(__package__, "release.lua")

_FINISH = lua(__package__, "finish.lua")

_COUNTS = lua(__package__, "counts.lua")

_PRUNE = lua(__package__, "prune.lua")

_SCRIPTS = {
    "admit": _FILTER + _ADMIT,
    "set_bits": _FILTER + _SET_BITS,
    "claim": _CLAIM,
    "extend": _EXTEND,
    "release": _RELEASE,
    "finish": _FINISH,
    "counts": _COUNTS,
    "prune": _PRUNE,
}


#: A seed's header in the admit script's packed argument (Lua: struct.unpack).
_ENTRY = struct.Struct("<IIdBBII")


def _pack(entries: Sequence[Entry], indexes: Sequence[int]) -> tuple[bytes, list[bytes]]:
    """The admit script's entries argument (one blob instead of seven arguments per seed,
    which would cost the client more to encode than the script costs Redis), and each
    seed's hash halves as set_bits takes them."""
    parts: list[bytes] = []
    pairs: list[bytes] = []
    header = _ENTRY.pack
    for i in indexes:
        e = entries[i]
        h1, h2 = split_hash(e.hash)
        priority = str(e.seed.priority).encode()
        key = e.key.encode()
        payload = e.seed.encode().encode()
        head = header(h1, h2, _ms(e.ready_at), e.dispatched, len(priority), len(key), len(payload))
        parts += (head, priority, key, payload)
        pairs.append(head[:8])  # h1 h2, as _PAIR packs them
    return b"".join(parts), pairs


def _ms(t: float) -> int:
    return math.floor(t * 1000)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisSeedStore:
    """Seeds of frontier ``name`` on the Redis (or Valkey) server at ``url``."""

    def __init__(
        self, url: str | Backend, name: str, *, prefix: str, expected_items: int, fp_rate: float,
        archive: bool = True, lifo: bool = False,
    ) -> None:
        self.name = check_frontier_name(name)
        self.url = str(url)
        self.prefix = prefix
        #: True: of one priority the newest seed is claimed first (admit.lua's order)
        self.lifo = lifo
        #: False: finished seeds lose their records (see FrontierConfig.archive)
        self.archive = archive
        self.expected_items = expected_items
        self.fp_rate = fp_rate
        self.keys = frontier_keys(prefix, name)
        self.stem = self.keys["segment"]
        plan = layer_plan(expected_items, fp_rate * (1 - CACHE_SHARE), 24)
        self._plan = [layer for layer in plan if layer.bits <= MAX_LAYER_BITS]
        if not self._plan:
            raise FrontierError(
                f"frontier {name!r}: expected_items {expected_items} at fp_rate {fp_rate} "
                "needs a bloom layer over 2^32 bits, the most a Redis string holds: lower "
                "expected_items or raise fp_rate"
            )
        self._plan_arg = ";".join(
            f"{layer.capacity},{layer.bits},{layer.hashes}" for layer in self._plan
        )
        self.redis = redis_client(url, name=f"frontier {name!r}")
        self.scripts = {n: self.redis.register_script(_PRELUDE + s) for n, s in _SCRIPTS.items()}
        self._pubsub: Any = None
        # per segment, keys the shared filter answered for in this process: a repeat
        # found here is a duplicate without a round trip (see CACHE_SHARE)
        self._answered: dict[int, FixedBloom] = {}
        # tasks setting the filter bits of admitted keys (see _owe)
        self._setters: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<RedisSeedStore {self.name!r} at {redact_url(self.url)} prefix={self.prefix!r}>"

    async def _call(self, op: str, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except RedisError as exc:
            raise FrontierError(
                f"frontier {self.name!r} on Redis {redact_url(self.url)}: {op} failed: {exc} "
                "(check the server is running and the URL is right)"
            ) from exc

    def _seg(self, segment: int | str, part: str) -> str:
        return frontier_segment_key(self.prefix, self.name, int(segment), part)

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        await self._call("ping", self.redis.ping())

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.settle()
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
        await self.redis.aclose()

    async def snapshot(self, current_segment: int) -> None:
        """The filter lives in Redis (persisted by Redis itself); this frees the caches
        of past segments."""
        for segment in [s for s in self._answered if s < current_segment]:
            del self._answered[segment]

    # ------------------------------------------------------------------ admission
    async def admit(self, entries: Sequence[Entry], now: float, *, exact: bool) -> list[bool]:
        check_entries(entries)
        results = [False] * len(entries)
        # per segment: key -> index of its first entry; repeats in the batch and keys this
        # process saw answered before are duplicates settled here
        groups: dict[int, dict[str, int]] = defaultdict(dict)
        settled: dict[int, int] = defaultdict(int)
        for i, e in enumerate(entries):
            first = groups[e.segment]
            if e.key in first or (not exact and e.hash in self._cache(e.segment)):
                settled[e.segment] += 1
            else:
                first[e.key] = i
        owing = False
        for segment, first in groups.items():
            owing |= await self._admit_segment(
                entries, list(first.values()), segment, settled[segment], now, exact, results
            )
        while owing and len(self._setters) > _SETTERS_MAX:  # Redis is behind: wait for it
            await asyncio.wait(set(self._setters), return_when=asyncio.FIRST_COMPLETED)
        return results

    async def duplicates(self, entries: Sequence[Entry], *, exact: bool) -> list[bool]:
        """One HMGET of the seed records per segment (exact or not: a stored key is
        certainly a duplicate) and one HINCRBY of the segment's duplicate count."""
        check_entries(entries)
        out = [False] * len(entries)
        by_segment: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(entries):
            by_segment[e.segment].append(i)
        for segment, indexes in by_segment.items():
            found = await self._call("duplicates", self.redis.hmget(
                self._seg(segment, "seeds"), [entries[i].key for i in indexes]))
            n = 0
            for i, record in zip(indexes, found, strict=True):
                if record is not None:
                    out[i] = True
                    n += 1
            if n:
                await self._call("duplicates", self.redis.hincrby(
                    self._seg(segment, "stats"), "duplicates", n))
        return out

    async def _admit_segment(
        self,
        entries: Sequence[Entry],
        indexes: list[int],
        segment: int,
        settled: int,
        now: float,
        exact: bool,
        results: list[bool],
    ) -> bool:
        """The admit script over ``entries[indexes]`` of one segment; True when filter
        bits are owed."""
        k = self.keys
        keys = [
            self._seg(segment, "bloom"),
            self._seg(segment, "seeds"),
            self._seg(segment, "stats"),
            k["ready"],
            k["due"],
            k["seq"],
            k["segments"],
        ]
        if not indexes:  # all settled here: only the counter goes to Redis
            await self._call("admit", self.redis.hincrby(keys[2], "duplicates", settled))
            return False
        cache = self._cache(segment)
        owing = False
        for start in range(0, len(indexes), _BATCH):
            chunk = indexes[start : start + _BATCH]
            blob, pairs = _pack(entries, chunk)
            args: list[str | int | bytes] = [
                segment,
                self._plan_arg,
                _ms(now),
                "1" if exact else "0",
                k["signal"],
                blob,
                settled if start == 0 else 0,
                "1" if self.lifo else "0",
            ]
            flags = _text(await self._call("admit", self.scripts["admit"](keys, args)))
            owed: dict[str, list[bytes]] = {"1": [], "2": []}
            for i, pair, flag in zip(chunk, pairs, flags, strict=True):
                results[i] = flag in "13"
                if flag in owed:
                    owed[flag].append(pair)
                cache.add(entries[i].hash)  # admitted or found: the shared filter has it
            if owed["1"] or owed["2"]:
                await self._owe(segment, b"".join(owed["1"]), b"".join(owed["2"]))
                owing = True
        return owing

    async def _owe(self, segment: int, admitted: bytes, found: bytes) -> None:
        """Have the bits of stored keys set after ``admit`` returns (the seed records
        decide admission; the filter may learn a key a moment later). The script is
        written to Redis now, so Redis sets the bits while the caller works on its next
        batch; a task reads the reply."""
        args = [segment, self._plan_arg, admitted, found]
        key = self._seg(segment, "bloom")
        pool = self.redis.connection_pool
        try:
            conn = await pool.get_connection()
        except Exception:
            log.exception("frontier %s: setting filter bits failed", self.name)
            return
        try:
            await conn.send_command("EVALSHA", self.scripts["set_bits"].sha, 1, key, *args)
        except Exception:
            await pool.release(conn)
            log.exception("frontier %s: setting filter bits failed", self.name)
            return
        task = asyncio.create_task(self._set_bits_reply(conn, key, args))
        self._setters.add(task)
        task.add_done_callback(self._setters.discard)

    async def _set_bits_reply(self, conn: Any, key: str, args: list[Any]) -> None:
        pool = self.redis.connection_pool
        try:
            try:
                await conn.read_response()
            finally:
                await pool.release(conn)
        except NoScriptError:  # a server that has not seen the script yet: load and run it
            try:
                await self.scripts["set_bits"]([key], args)
            except Exception:
                log.exception("frontier %s: setting filter bits failed", self.name)
        except Exception:  # the keys stay admitted once; their repeats cost an HSETNX
            log.exception("frontier %s: setting filter bits failed", self.name)

    async def settle(self) -> None:
        """Wait until the filter has the bits of every key admitted so far."""
        while self._setters:
            await asyncio.wait(set(self._setters))

    def _cache(self, segment: int) -> FixedBloom:
        cache = self._answered.get(segment)
        if cache is None:
            capacity = min(self.expected_items, CACHE_MAX)
            cache = self._answered[segment] = FixedBloom(capacity, self.fp_rate * CACHE_SHARE)
        return cache

    async def admitted_by(self, segment: int, key: str) -> str | None:
        raw = await self._call("admitted_by", self.redis.hget(self._seg(segment, "seeds"), key))
        if raw is None:
            return None
        return task_uuid_of(_text(raw).split("|", 2)[2])

    # ------------------------------------------------------------------ dispatch
    async def claim(self, n: int, now: float, lease_until: float) -> list[Seed]:
        k = self.keys
        raw = await self._call(
            "claim",
            self.scripts["claim"](
                [k["ready"], k["due"], k["leased"]],
                [self.stem, _ms(now), _ms(lease_until), n],
            ),
        )
        out = []
        for i in range(0, len(raw), 5):
            out.append(
                Seed.decode(
                    raw[i + 3],
                    segment=int(raw[i]),
                    key=_text(raw[i + 1]),
                    attempts=int(raw[i + 2]),
                    lease_until=lease_until,
                    rank=int(raw[i + 4]),
                )
            )
        return out

    def _idents(self, seeds: Sequence[Seed]) -> list[Any]:
        args: list[Any] = []
        for s in seeds:
            if s.segment is None or s.key is None:
                raise FrontierError(f"seed {s.url!r} was not leased from frontier {self.name!r}")
            args += [s.segment, s.key]
        return args

    async def extend(self, seeds: Sequence[Seed], lease_until: float) -> list[bool]:
        if not seeds:
            return []
        flags = await self._call(
            "extend",
            self.scripts["extend"](
                [self.keys["leased"]], [self.stem, _ms(lease_until), *self._idents(seeds)]
            ),
        )
        return [f == "1" for f in _text(flags)]

    async def release(self, seeds: Sequence[Seed]) -> int:
        if not seeds:
            return 0
        k = self.keys
        return int(
            await self._call(
                "release",
                self.scripts["release"](
                    [k["ready"], k["leased"]], [self.stem, k["signal"], *self._idents(seeds)]
                ),
            )
        )

    async def finish(
        self, done: Sequence[tuple[Seed, Outcome]], now: float, ready_at: float
    ) -> list[bool]:
        """One script call per ``_BATCH`` seeds (a spider finishes what the engine is done
        with in one round trip)."""
        k = self.keys
        out: list[bool] = []
        ready_ms = _ms(ready_at)
        for start in range(0, len(done), _BATCH):
            args: list[Any] = [self.stem, k["signal"], _ms(now), "1" if self.archive else "0"]
            chunk = done[start : start + _BATCH]
            idents = self._idents([seed for seed, _ in chunk])
            for i, (_, outcome) in enumerate(chunk):
                args += [idents[2 * i], idents[2 * i + 1], outcome, ready_ms]
            flags = await self._call(
                "finish", self.scripts["finish"]([k["ready"], k["due"], k["leased"]], args))
            out += [f == "1" for f in _text(flags)]
        return out

    async def next_due(self, now: float) -> float | None:
        k = self.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(k["ready"])
            pipe.zrange(k["due"], 0, 0, withscores=True)
            pipe.zrange(k["leased"], 0, 0, withscores=True)
            ready, due, leased = await self._call("next_due", pipe.execute())
        if ready:
            return now
        times = [float(items[0][1]) / 1000 for items in (due, leased) if items]
        return min(times) if times else None

    async def counts(self, now: float) -> list[SegmentCounts]:
        k = self.keys
        raw = await self._call(
            "counts",
            self.scripts["counts"](
                [k["ready"], k["due"], k["leased"], k["segments"]], [self.stem, _ms(now)]
            ),
        )
        out = []
        for i in range(0, len(raw), 2):
            c = SegmentCounts(int(raw[i]))
            fields = raw[i + 1]
            for j in range(0, len(fields), 2):
                name = _text(fields[j])
                if name in _COUNTERS:
                    setattr(c, name, int(fields[j + 1]))
            out.append(c)
        return out

    async def prune(self, before_segment: int) -> list[int]:
        gone = await self._call(
            "prune",
            self.scripts["prune"]([self.keys["segments"]], [self.stem, before_segment]),
        )
        for segment in gone:
            self._answered.pop(int(segment), None)
        return [int(s) for s in gone]

    async def wait_signal(self, timeout: float) -> None:
        if self._pubsub is None:
            self._pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            await self._call("subscribe", self._pubsub.subscribe(self.keys["signal"]))
        message = await self._call("wait", self._pubsub.get_message(timeout=max(timeout, 0.0)))
        if message is not None:
            # drain the signals that piled up while nobody waited
            while await self._call("wait", self._pubsub.get_message(timeout=0.0)) is not None:
                pass

    async def filter_bytes(self) -> int:
        total = 0
        segments = await self._call("segments", self.redis.zrange(self.keys["segments"], 0, -1))
        for seg in segments:
            meta = self._seg(_text(seg), "bloom")
            layers = int(await self._call("bloom", self.redis.hget(meta, "layers")) or 0)
            for i in range(1, layers + 1):
                usage = await self._call(
                    "memory", self.redis.memory_usage(f"{meta}:{i}", samples=0)
                )
                total += int(usage or 0)
        return total

    async def validators(self, keys: Sequence[str]) -> dict[str, Validators]:
        unique = list(dict.fromkeys(keys))
        out: dict[str, Validators] = {}
        for start in range(0, len(unique), _BATCH):
            chunk = unique[start:start + _BATCH]
            values = await self._call("validators", self.redis.hmget(self.keys["validators"],
                                                                     chunk))
            out.update({k: Validators.decode(v) for k, v in zip(chunk, values, strict=True)
                        if v is not None})
        return out

    async def remember(self, items: Sequence[tuple[str, Validators]]) -> None:
        for start in range(0, len(items), _BATCH):
            chunk = items[start:start + _BATCH]
            await self._call("remember", self.redis.hset(
                self.keys["validators"], mapping={k: v.encode() for k, v in chunk}))

    async def stored(self, segment: int, keys: Sequence[str]) -> set[str]:
        unique = list(dict.fromkeys(keys))
        found: set[str] = set()
        for start in range(0, len(unique), _BATCH):
            chunk = unique[start:start + _BATCH]
            values = await self._call("stored", self.redis.hmget(self._seg(segment, "seeds"),
                                                                 chunk))
            found.update(k for k, v in zip(chunk, values, strict=True) if v is not None)
        return found

    async def archived(self, segment: int, cursor: str, count: int) -> tuple[str, list[Seed]]:
        found: Any
        nxt, found = await self._call("archived", self.redis.hscan(
            self._seg(segment, "seeds"), int(cursor or 0), count=count))
        seeds = [Seed.decode(_text(v).split("|", 2)[2]) for v in found.values()]
        return ("" if int(nxt) == 0 else str(nxt)), seeds

    async def purge(self) -> None:
        stem = self.keys["ready"].rsplit(":", 1)[0]
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in stem) + ":*"
        self._answered.clear()
        async for key in self.redis.scan_iter(match=pattern, count=1000):
            await self._call("purge", self.redis.delete(key))

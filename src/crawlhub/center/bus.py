"""The download center's messaging: named channels on Redis Streams, or in process.

A *channel* is an append-only stream of messages (a JSON header and optional raw body
bytes). Each is read one of two ways:

- **as a group** (``read`` / ``ack`` / ``claim``): every message goes to one reader of the
  channel's one consumer group and stays *pending* for that reader until acked; a reader
  that restarts reads its own pending first (``read(pending=True)``); a reader that died
  leaves its pending messages to ``claim`` by another after they sat idle. The centers'
  request and registration channels, each agent's command channel and each job's reply
  channel are read this way.
- **as a tail** (``tail``): every reader sees every message after the id it passed; the
  heartbeat channel is read this way, so each center knows every agent's last beat.

``take_all`` empties a channel atomically - unread and pending messages alike - and hands
them to the caller: how a dead agent's commands are taken back, by exactly one center.

Two implementations: :class:`RedisBus` (XADD / XREADGROUP / XAUTOCLAIM, one Lua script
for ``take_all``; every process sharing the server shares the channels) and
:class:`MemoryBus` (asyncio, one process; ``open_bus("memory://name")`` returns the same
bus to every caller in the process). Broker failures raise :class:`BusError`; retry
policy belongs to the caller (the seed's rules differ for jobs, agents and centers).

On Redis, an entry that cannot be taken - its header not a JSON object, or (with a
:class:`~crawlhub.core.signing.Signer`) unsigned, badly signed or signed outside the time
window - never reaches the caller: it is acked, counted and logged once with its id
(:mod:`crawlhub.core.rejects`) and copied to the dead stream ``<prefix>dead:center``. A reader
that finds a message of the right form but the wrong content calls :meth:`Bus.reject`
and acks it as usual. Either way the read loop goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from crawlhub.backends.backend import Backend
from crawlhub.backends.redis import lua, redis_client, write_commands
from crawlhub.core import jsoncodec, rejects
from crawlhub.core.errors import CrawlhubError
from crawlhub.core.keys import DEFAULT_PREFIX, dead_stream
from crawlhub.core.redact import redact_url
from crawlhub.core.signing import Signer, warn_unsigned

#: The consumer group of every group-read channel.
GROUP = "g"


async def wait_until(awaitable: Any, seconds: float) -> None:
    """Await ``awaitable`` for at most ``seconds``; running out of time is not an error.
    Not ``wait_for`` inside ``suppress(TimeoutError)``: on Python 3.11 a cancellation
    that lands as the timeout fires comes out as ``TimeoutError`` there and is swallowed
    (a cancelled agent went on beating); ``asyncio.timeout`` tells the two apart."""
    try:
        async with asyncio.timeout(seconds):
            await awaitable
    except TimeoutError:
        pass


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` when the running task was asked to stop. A cancel that
    lands while redis-py reads can come out of it as a connection or timeout error; a
    retry loop that took it for a broker error would swallow the cancel and run on (a
    halted center's loop outlived it, and the event loop's shutdown waited on it for
    ever; a halted agent's heartbeat loop went on beating). ``Task.cancelling()`` keeps
    the request however the error was dressed. :meth:`RedisBus._call` asks first, so no
    caller sees such a cancel as a :class:`BusError`."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class BusError(CrawlhubError):
    """The broker failed (down, refused, timed out); the message says which and what."""


async def retry_forever(stop: asyncio.Event, step: Callable[[], Awaitable[None]], *,
                        logger: logging.Logger, who: str, what: str, first: float = 0.2,
                        longest: float = 5.0) -> None:
    """Run ``step()`` until ``stop`` is set: the read loops of centers and agents, which
    outlive any broker outage. A :class:`BusError` is logged once per outage (and its
    end once) and retried with a pause doubling from ``first`` to ``longest`` s; any
    other error is logged with its traceback and retried after the current pause. A
    cancel always ends the loop."""
    pause = first
    down = False
    while not stop.is_set():
        try:
            await step()
        except BusError as exc:
            if not down:
                logger.warning("%s: %s: %s; retrying", who, what, exc)
                down = True
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)
            continue
        except Exception:
            raise_if_cancelled()  # e.g. the registry's own Redis client, not the bus
            logger.exception("%s: %s failed; going on", who, what)
            await asyncio.sleep(pause)
            continue
        if down:
            logger.warning("%s: %s: the broker answers again", who, what)
            down = False
        pause = first


@dataclass(slots=True)
class Envelope:
    """One message read from a channel: its ``id`` (what ``ack`` takes), ``header`` (a
    JSON object) and ``body`` (raw bytes, often empty)."""

    id: str
    header: dict[str, Any]
    body: bytes = b""
    #: the header as it travelled (JSON bytes; Redis only): forwarded as is, not encoded
    #: again, when a center passes a request on unchanged
    raw: bytes = b""


#: ``(channel, header, body)``; the header a mapping, or JSON bytes already encoded
Outgoing = tuple[str, Mapping[str, Any] | bytes, bytes]


class Bus(Protocol):
    """Channels on one broker. Every method is one round trip (a pipeline or a script)."""

    url: str

    async def send(self, channel: str, header: Mapping[str, Any], body: bytes = b"") -> str:
        """Append one message; its id."""
        ...

    async def send_many(self, items: Sequence[Outgoing], *, maxlen: int = 0,
                        ack: Mapping[str, Sequence[str]] | None = None) -> None:
        """Append ``(channel, header, body)`` messages in one trip; ``maxlen`` > 0 trims
        each channel written to about that many messages (tail channels). ``ack``
        (channel -> ids) acks messages in the same trip, after the sends."""
        ...

    async def read(self, channel: str, consumer: str, *, count: int = 100,
                   block: float = 1.0, pending: bool = False, send: Sequence[Outgoing] = (),
                   ack: Mapping[str, Sequence[str]] | None = None) -> list[Envelope]:
        """Up to ``count`` new messages for ``consumer`` of the channel's group, waiting
        up to ``block`` s for the first; with ``pending`` the messages already delivered
        to this consumer and not acked (after its restart), without waiting.

        ``send`` and ``ack`` (as in :meth:`send_many`) go first, in the same trip: a
        reader hands on what its last batch caused and acks that batch in the write that
        also waits for the next one - no round trip of its own in between, during which
        a new message would wait. A :class:`BusError` leaves unknown whether they went
        (as a failed ``send_many`` does); if the read alone failed they went."""
        ...

    async def ack(self, channel: str, ids: Sequence[str]) -> None:
        """Finish messages of the group: acked and deleted."""
        ...

    async def claim(self, channel: str, consumer: str, idle: float,
                    count: int = 100) -> list[Envelope]:
        """Take over messages pending for other consumers for more than ``idle`` s."""
        ...

    async def tail(self, channel: str, after: str, *, count: int = 1000,
                   block: float = 1.0) -> tuple[list[Envelope], str]:
        """Messages after id ``after`` (``"$"``: only new ones; ``"<ms>-0"``: since that
        epoch millisecond), and the id to pass next time."""
        ...

    async def take_all(self, channel: str) -> list[Envelope]:
        """Every message of the channel, unread or pending, removed in one atomic step."""
        ...

    async def length(self, channels: Sequence[str]) -> list[int]:
        """Messages held by each channel (unread and pending)."""
        ...

    async def delete(self, channel: str) -> None: ...

    async def reject(self, channel: str, env: Envelope, reason: str, detail: str) -> None:
        """Set aside a message its reader cannot serve (counted, logged once with its id,
        copied to the dead stream); the reader still acks it."""
        ...

    async def put(self, table: str, key: str, value: Mapping[str, Any]) -> None:
        """Store a record (allocations): ``table`` is a hash of JSON objects."""
        ...

    async def get(self, table: str, key: str) -> dict[str, Any] | None: ...

    async def all(self, table: str) -> dict[str, dict[str, Any]]: ...

    async def drop(self, table: str, key: str) -> bool: ...

    async def close(self) -> None: ...


def open_bus(url: str | Backend, *, prefix: str = DEFAULT_PREFIX,
             signer: Signer | None = None) -> Bus:
    """The bus on ``url``: ``redis://...`` (or ``valkey://``, ``rediss://``, ``unix://``)
    or ``memory://NAME`` (in process; the same object for every caller of that name).
    ``signer``: sign every message sent and drop every one read that it does not accept
    (Redis only: in process no one else writes)."""
    if isinstance(url, str) and url.startswith("memory://"):
        name = url[len("memory://"):] or "default"
        bus = _MEMORY.get(name)
        if bus is None or bus.closed:
            bus = _MEMORY[name] = MemoryBus(url)
        bus.users += 1
        return bus
    backend = Backend.parse(url, kinds=BUSES, what="download center bus")
    redis_bus: Bus = backend.open(BUSES, prefix=prefix, signer=signer)
    return redis_bus


def channel_family(channel: str) -> str:
    """The counter label of a channel: ``center:agent`` for ``agent:<id>``, not one label
    per agent or job."""
    return "center:" + channel.split(":", 1)[0]


#: Errors a reader meets in a message of the right form and the wrong content (a number
#: that is not one, a list where a mapping belongs): the message is rejected, not retried.
MALFORMED = (TypeError, ValueError, AttributeError, KeyError, IndexError)


# ------------------------------------------------------------------------ in process
class _Chan:
    __slots__ = ("unread", "pending", "wake", "log", "first")

    def __init__(self) -> None:
        self.unread: deque[Envelope] = deque()
        #: id -> (consumer, when delivered, envelope)
        self.pending: dict[str, tuple[str, float, Envelope]] = {}
        self.wake = asyncio.Event()
        #: tail channels: (sequence, envelope), bounded by ``maxlen``
        self.log: deque[tuple[int, Envelope]] = deque()
        self.first = 0


_MEMORY: dict[str, MemoryBus] = {}


class MemoryBus:
    """:class:`Bus` in one process: deques and events, no persistence (the embedded
    center lives and dies with its process, and so do its jobs)."""

    def __init__(self, url: str = "memory://default") -> None:
        self.url = url
        self.closed = False
        self.users = 0
        self._chans: dict[str, _Chan] = {}
        self._tables: dict[str, dict[str, dict[str, Any]]] = {}
        self._seq = itertools.count(1)
        #: rejected messages (channel, envelope, reason), the newest kept
        self.dead: deque[tuple[str, Envelope, str]] = deque(maxlen=rejects.DEAD_MAXLEN)

    def _chan(self, name: str) -> _Chan:
        chan = self._chans.get(name)
        if chan is None:
            chan = self._chans[name] = _Chan()
        return chan

    def _check(self) -> None:
        if self.closed:
            raise BusError(f"the in-process bus {self.url} is closed")

    async def send(self, channel: str, header: Mapping[str, Any], body: bytes = b"") -> str:
        self._check()
        return self._append(channel, header, body, 0)

    def _append(self, channel: str, header: Mapping[str, Any] | bytes, body: bytes,
                maxlen: int) -> str:
        n = next(self._seq)
        head = jsoncodec.loads(header) if isinstance(header, bytes) else dict(header)
        env = Envelope(f"{n}-0", head, body)
        chan = self._chan(channel)
        chan.unread.append(env)
        chan.log.append((n, env))
        limit = maxlen or 10_000
        while len(chan.log) > limit:
            chan.log.popleft()
        chan.wake.set()
        return env.id

    async def send_many(self, items: Sequence[Outgoing], *, maxlen: int = 0,
                        ack: Mapping[str, Sequence[str]] | None = None) -> None:
        self._check()
        for channel, header, body in items:
            self._append(channel, header, body, maxlen)
        for channel, ids in (ack or {}).items():
            await self.ack(channel, ids)

    async def read(self, channel: str, consumer: str, *, count: int = 100,
                   block: float = 1.0, pending: bool = False, send: Sequence[Outgoing] = (),
                   ack: Mapping[str, Sequence[str]] | None = None) -> list[Envelope]:
        self._check()
        if send or any((ack or {}).values()):
            await self.send_many(send, ack=ack)
        chan = self._chan(channel)
        if pending:
            return [env for who, _, env in chan.pending.values() if who == consumer][:count]
        if not chan.unread and block > 0:
            chan.wake.clear()
            await wait_until(chan.wake.wait(), block)
            self._check()
        out: list[Envelope] = []
        now = asyncio.get_running_loop().time()
        while chan.unread and len(out) < count:
            env = chan.unread.popleft()
            chan.pending[env.id] = (consumer, now, env)
            out.append(env)
        return out

    async def ack(self, channel: str, ids: Sequence[str]) -> None:
        self._check()
        chan = self._chans.get(channel)
        if chan is not None:
            for i in ids:
                chan.pending.pop(i, None)

    async def claim(self, channel: str, consumer: str, idle: float,
                    count: int = 100) -> list[Envelope]:
        self._check()
        chan = self._chans.get(channel)
        if chan is None:
            return []
        now = asyncio.get_running_loop().time()
        out: list[Envelope] = []
        for i, (who, since, env) in list(chan.pending.items()):
            if who != consumer and now - since >= idle and len(out) < count:
                chan.pending[i] = (consumer, now, env)
                out.append(env)
        return out

    async def tail(self, channel: str, after: str, *, count: int = 1000,
                   block: float = 1.0) -> tuple[list[Envelope], str]:
        self._check()
        chan = self._chan(channel)
        top = chan.log[-1][0] if chan.log else 0
        last = top if after == "$" else int(after.split("-")[0])
        if last > top:
            last = 0  # an epoch-millisecond start: in process every message is recent
        newer = [(n, e) for n, e in chan.log if n > last]
        if not newer and block > 0:
            chan.wake.clear()
            await wait_until(chan.wake.wait(), block)
            newer = [(n, e) for n, e in chan.log if n > last]
        newer = newer[:count]
        if newer:
            last = newer[-1][0]
        return [e for _, e in newer], f"{last}-0"

    async def take_all(self, channel: str) -> list[Envelope]:
        self._check()
        chan = self._chans.pop(channel, None)
        if chan is None:
            return []
        out = [env for _, _, env in chan.pending.values()] + list(chan.unread)
        return sorted(out, key=lambda e: int(e.id.split("-")[0]))

    async def length(self, channels: Sequence[str]) -> list[int]:
        out = []
        for name in channels:
            chan = self._chans.get(name)
            out.append(0 if chan is None else len(chan.unread) + len(chan.pending))
        return out

    async def delete(self, channel: str) -> None:
        self._chans.pop(channel, None)

    async def reject(self, channel: str, env: Envelope, reason: str, detail: str) -> None:
        rejects.rejected(channel_family(channel), env.id, reason, f"{channel}: {detail}")
        self.dead.append((channel, env, reason))

    async def put(self, table: str, key: str, value: Mapping[str, Any]) -> None:
        self._check()
        self._tables.setdefault(table, {})[key] = jsoncodec.loads(jsoncodec.dumps(dict(value)))

    async def get(self, table: str, key: str) -> dict[str, Any] | None:
        self._check()
        value = self._tables.get(table, {}).get(key)
        return None if value is None else dict(value)

    async def all(self, table: str) -> dict[str, dict[str, Any]]:
        self._check()
        return {k: dict(v) for k, v in self._tables.get(table, {}).items()}

    async def drop(self, table: str, key: str) -> bool:
        self._check()
        return self._tables.get(table, {}).pop(key, None) is not None

    async def close(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self.closed = True
            for chan in self._chans.values():
                chan.wake.set()
            name = self.url[len("memory://"):] or "default"
            if _MEMORY.get(name) is self:
                del _MEMORY[name]


# ------------------------------------------------------------------------ Redis
_TAKE_ALL = lua(__package__, "take_all.lua")


#: Bad records already counted: (hash key, field, hash of the value).
_BAD_RECORDS = rejects.Once()

#: A rejected entry: (id, reason, detail, its fields).
_Bad = tuple[str, str, str, dict[Any, Any]]


def _envelopes(entries: Any, channel: str = "", signer: Signer | None = None,
               fresh: bool = True) -> tuple[list[Envelope], list[_Bad]]:
    """The entries as envelopes, and those that cannot be taken: no JSON object in
    ``h``, or (with ``signer``) not signed by its key inside the time window."""
    out: list[Envelope] = []
    bad: list[_Bad] = []
    for raw_id, fields in entries or ():
        mid = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        if not fields:  # deleted after delivery: nothing to hand over
            continue
        if isinstance(fields, list):  # from a script: flat [k, v, k, v]
            fields = {fields[i]: fields[i + 1] for i in range(0, len(fields), 2)}
        head = fields.get(b"h")
        body = fields.get(b"b") or b""
        if not isinstance(head, bytes):
            bad.append((mid, rejects.MALFORMED, "no header field 'h'", fields))
            continue
        if signer is not None:
            refused = signer.verify(channel, head, body, fields.get(b"t"), fields.get(b"s"),
                                    fresh=fresh)
            if refused is not None:
                bad.append((mid, *refused, fields))
                continue
        try:
            header = jsoncodec.loads(head)
        except (ValueError, TypeError, RecursionError) as exc:
            bad.append((mid, rejects.MALFORMED, f"the header is not JSON ({exc})", fields))
            continue
        if not isinstance(header, dict):
            bad.append((mid, rejects.MALFORMED,
                        f"the header is a JSON {type(header).__name__}, not an object", fields))
            continue
        out.append(Envelope(mid, header, body, head))
    return out, bad


class RedisBus:
    """:class:`Bus` on Redis Streams: channel ``name`` is the stream
    ``<prefix>center:<name>``, its group ``g``; tables are hashes of JSON."""

    def __init__(self, url: str | Backend, *, prefix: str = DEFAULT_PREFIX,
                 longest_block: float = 5.0, signer: Signer | None = None) -> None:
        self.url = str(url)
        self.signer = signer
        self._prefix = f"{prefix}center:"
        self.dead_key = dead_stream(prefix, "center")
        # retries=0: the caller's failure rules count broker errors, the client must not
        # hide them behind its own retries
        self._redis = redis_client(url, name="download center bus", retries=0,
                                   socket_timeout=longest_block + 10.0)
        self._groups: set[str] = set()
        self._take_all = self._redis.register_script(_TAKE_ALL)
        #: command, key and field names in Redis's protocol (pack_command)
        self._names: dict[str, bytes] = {}
        self._where = redact_url(self.url)
        if signer is None:
            warn_unsigned(self.url)

    def key(self, channel: str) -> str:
        return self._prefix + channel

    async def _call(self, op: str, awaitable: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            return await awaitable
        except RedisError as exc:
            raise_if_cancelled()
            raise BusError(f"the broker {self._where} failed to {op}: "
                           f"{type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            raise_if_cancelled()
            raise BusError(f"the broker {self._where} failed to {op}: {exc}") from exc

    async def _group(self, key: str) -> None:
        if key in self._groups:
            return
        from redis.exceptions import ResponseError

        try:
            await self._call("create a consumer group",
                             self._redis.xgroup_create(key, GROUP, id="0", mkstream=True))
        except BusError as exc:
            if not isinstance(exc.__cause__, ResponseError) or "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(key)

    def _fields(self, channel: str, header: Mapping[str, Any] | bytes, body: bytes) -> Any:
        head = header if isinstance(header, bytes) else jsoncodec.dumps(dict(header)).encode()
        fields: dict[str, Any] = {"h": head}
        if body:
            fields["b"] = body
        if self.signer is not None:
            fields["t"], fields["s"] = self.signer.sign(channel, head, body)
        return fields

    def _take(self, channel: str, entries: Any) -> tuple[list[Envelope], list[_Bad]]:
        # registrations are processed however old (protocol): only "too far ahead" counts
        return _envelopes(entries, channel, self.signer, fresh=channel != "register")

    async def _set_aside(self, channel: str, bad: Sequence[_Bad], *, ack: bool) -> None:
        """Count, log and keep rejected entries; ``ack``: ack and delete them too (group
        reads: else they would be read again for ever). One round trip."""
        if not bad:
            return
        key = self.key(channel)
        pipe = self._redis.pipeline(transaction=False)
        for mid, reason, detail, fields in bad:
            rejects.rejected(channel_family(channel), mid, reason, f"{key}: {detail}",
                             dead=self.dead_key)
            rejects.xadd_dead(pipe, self.dead_key,
                              rejects.dead_fields(key, mid, reason, detail, fields))
        if ack:
            ids = [mid for mid, *_ in bad]
            pipe.xack(key, GROUP, *ids)
            pipe.xdel(key, *ids)
        await self._call(f"set aside {len(bad)} rejected entries of {channel}", pipe.execute())

    async def reject(self, channel: str, env: Envelope, reason: str, detail: str) -> None:
        fields: dict[Any, Any] = {b"h": env.raw or jsoncodec.dumps(env.header)}
        if env.body:
            fields[b"b"] = env.body
        await self._set_aside(channel, [(env.id, reason, detail, fields)], ack=False)

    async def send(self, channel: str, header: Mapping[str, Any], body: bytes = b"") -> str:
        mid = await self._call(f"send to {channel}", self._redis.xadd(
            self.key(channel), self._fields(channel, header, body)))
        return mid.decode() if isinstance(mid, bytes) else str(mid)

    async def send_many(self, items: Sequence[Outgoing], *, maxlen: int = 0,
                        ack: Mapping[str, Sequence[str]] | None = None) -> None:
        acks = {c: ids for c, ids in (ack or {}).items() if ids}
        if not items and not acks:
            return
        what = f"send {len(items)} messages"
        self._raise_first(what, await self._exchange(what, self._commands(items, acks,
                                                                          maxlen)))

    def _commands(self, items: Sequence[Outgoing], acks: Mapping[str, Sequence[str]],
                  maxlen: int = 0) -> list[tuple[Any, ...]]:
        """XADD every item, then XACK + XDEL every acked id."""
        out: list[tuple[Any, ...]] = []
        trim = ("MAXLEN", "~", maxlen) if maxlen else ()
        for channel, header, body in items:
            fields = self._fields(channel, header, body)
            out.append(("XADD", self.key(channel), *trim, "*",
                        *itertools.chain.from_iterable(fields.items())))
        for channel, ids in acks.items():
            key = self.key(channel)
            raw = [i.encode() for i in ids]  # (bytes: ids must not fill the names cache)
            out.append(("XACK", key, GROUP, *raw))
            out.append(("XDEL", key, *raw))
        return out

    async def _exchange(self, what: str, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """``commands`` in one trip (``write_commands``): their replies as the server sends
        them (an XREADGROUP's entries are ``[id, [field, value, ...]]``), an error reply
        in its place as its exception; a connection that fails raises :class:`BusError`."""

        async def trip() -> list[Any]:
            return await (await write_commands(self._redis, commands, self._names))

        replies: list[Any] = await self._call(what, trip())
        return replies

    def _raise_first(self, what: str, replies: Sequence[Any]) -> None:
        """:class:`BusError` for the first error reply of ``replies``, if any."""
        from redis.exceptions import RedisError

        for reply in replies:
            if isinstance(reply, RedisError):
                raise BusError(f"the broker {self._where} failed to {what}:"
                               f" {type(reply).__name__}: {reply}") from reply

    async def read(self, channel: str, consumer: str, *, count: int = 100,
                   block: float = 1.0, pending: bool = False, send: Sequence[Outgoing] = (),
                   ack: Mapping[str, Sequence[str]] | None = None) -> list[Envelope]:
        from redis.exceptions import RedisError, ResponseError

        key = self.key(channel)
        await self._group(key)
        acks = {c: ids for c, ids in (ack or {}).items() if ids}
        for _ in range(2):
            streams: dict[Any, Any] = {key: "0" if pending else ">"}
            wait = None if pending else max(1, int(block * 1000))
            try:
                got = await self._send_then_read(channel, send, acks, consumer, streams,
                                                 count, wait)
                send, acks = (), {}  # they went: a second try only reads
                if isinstance(got, RedisError):
                    raise BusError(f"the broker {self._where} failed to read {channel}:"
                                   f" {type(got).__name__}: {got}") from got
            except BusError as exc:
                if isinstance(exc.__cause__, ResponseError) and "NOGROUP" in str(exc):
                    self._groups.discard(key)  # emptied by take_all: create it again
                    await self._group(key)
                    continue
                raise
            if not got:
                return []
            # RESP3 answers a map of stream -> entries, RESP2 a list of [stream, entries]
            entries = next(iter(got.values())) if isinstance(got, dict) else got[0][1]
            envs, bad = self._take(channel, entries)
            await self._set_aside(channel, bad, ack=True)
            return envs
        return []

    async def _send_then_read(self, channel: str, items: Sequence[Outgoing],
                              acks: Mapping[str, Sequence[str]], consumer: str,
                              streams: dict[Any, Any], count: int, wait: int | None) -> Any:
        """One trip: the sends and acks, then XREADGROUP (the blocking command last:
        Redis answers the others at once and holds the read). A failed send or ack raises
        :class:`BusError`; the read's error (NOGROUP) is returned as a value - the sends
        went."""
        commands = self._commands(items, acks)
        block = ("BLOCK", wait) if wait is not None else ()
        commands.append(("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count, *block,
                         "STREAMS", *streams.keys(), *streams.values()))
        what = (f"send {len(items)} messages and read {channel}" if len(commands) > 1
                else f"read {channel}")
        results = await self._exchange(what, commands)
        self._raise_first(f"send {len(items)} messages", results[:-1])
        return results[-1]

    async def ack(self, channel: str, ids: Sequence[str]) -> None:
        if not ids:
            return
        what = f"ack on {channel}"
        self._raise_first(what, await self._exchange(what, self._commands((), {channel: ids})))

    async def claim(self, channel: str, consumer: str, idle: float,
                    count: int = 100) -> list[Envelope]:
        from redis.exceptions import ResponseError

        key = self.key(channel)
        try:
            got = await self._call(f"claim on {channel}", self._redis.xautoclaim(
                key, GROUP, consumer, min_idle_time=max(0, int(idle * 1000)),
                start_id="0-0", count=count))
        except BusError as exc:
            if isinstance(exc.__cause__, ResponseError) and "NOGROUP" in str(exc):
                return []
            raise
        envs, bad = self._take(channel, got[1])
        await self._set_aside(channel, bad, ack=True)
        return envs

    async def tail(self, channel: str, after: str, *, count: int = 1000,
                   block: float = 1.0) -> tuple[list[Envelope], str]:
        got = await self._call(f"read {channel}", self._redis.xread(
            {self.key(channel): after}, count=count, block=max(1, int(block * 1000))))
        if not got:
            if after == "$":
                last = await self._call(f"read {channel}",
                                        self._redis.xrevrange(self.key(channel), count=1))
                if last:
                    raw = last[0][0]
                    return [], raw.decode() if isinstance(raw, bytes) else str(raw)
            return [], after
        entries = got[0][1]
        raw = entries[-1][0]
        envs, bad = self._take(channel, entries)
        # not deleted: every center reads a tail channel, and one with a wrong key
        # must not wipe what the others can read
        await self._set_aside(channel, bad, ack=False)
        return envs, raw.decode() if isinstance(raw, bytes) else str(raw)

    async def take_all(self, channel: str) -> list[Envelope]:
        key = self.key(channel)
        got = await self._call(f"take back {channel}", self._take_all(keys=[key]))
        self._groups.discard(key)
        envs, bad = self._take(channel, got)
        await self._set_aside(channel, bad, ack=False)  # gone with the stream already
        return envs

    async def length(self, channels: Sequence[str]) -> list[int]:
        if not channels:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for channel in channels:
            pipe.xlen(self.key(channel))
        return [int(n) for n in await self._call("measure channels", pipe.execute())]

    async def delete(self, channel: str) -> None:
        await self._call(f"delete {channel}", self._redis.delete(self.key(channel)))
        self._groups.discard(self.key(channel))

    async def put(self, table: str, key: str, value: Mapping[str, Any]) -> None:
        await self._call(f"store {table}", self._redis.hset(
            self.key(table), key, jsoncodec.dumps(dict(value))))

    async def get(self, table: str, key: str) -> dict[str, Any] | None:
        raw = await self._call(f"read {table}", self._redis.hget(self.key(table), key))
        return None if raw is None else self._record(table, key, raw)

    async def all(self, table: str) -> dict[str, dict[str, Any]]:
        raw = await self._call(f"read {table}", self._redis.hgetall(self.key(table)))
        out = {}
        for k, v in raw.items():
            name = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
            record = self._record(table, name, v)
            if record is not None:
                out[name] = record
        return out

    def _record(self, table: str, key: str, raw: Any) -> dict[str, Any] | None:
        """A stored record, or None (counted and logged once, left in place) when it is
        not a JSON object: one bad record must not stop every read of the table."""
        try:
            value = jsoncodec.loads(raw)
        except (ValueError, TypeError, RecursionError) as exc:
            value, detail = None, f"not JSON ({exc})"
        else:
            detail = f"a JSON {type(value).__name__}, not an object"
        if isinstance(value, dict):
            return value
        # read on every sync: counted once per process
        if _BAD_RECORDS.first((self.key(table), key, hash(raw))):
            rejects.rejected(f"center:{table}", key, rejects.MALFORMED,
                             f"{self.key(table)}: {detail}; left in place, skipped")
        return None

    async def drop(self, table: str, key: str) -> bool:
        return bool(await self._call(f"drop from {table}",
                                     self._redis.hdel(self.key(table), key)))

    async def close(self) -> None:
        await self._redis.aclose()


#: The bus on each kind of broker (``memory://`` is not a storage URL: open_bus keeps it).
BUSES = {"redis": RedisBus}


class _OnError:
    """A message's waiter that hears only of a failure to send it (put_nowait)."""

    __slots__ = ("waiter",)

    def __init__(self, waiter: asyncio.Future[Any]) -> None:
        self.waiter = waiter


class Outbox:
    """Coalesces sends and acks into one ``send_many`` and one ``ack`` per channel per
    event-loop turn: callers ``put`` (and optionally wait until it was sent), the flusher
    sends whatever piled up meanwhile. A failed send is retried ``retries`` times with a
    doubling pause; then the waiting callers get the :class:`BusError` and messages
    nobody waits for are dropped (and counted in ``dropped``) - the seed's rule for an
    agent's replies: the job retries, or exits on its own rules."""

    def __init__(self, bus: Bus, *, retries: int = 3, first_pause: float = 0.05,
                 maxlen: int = 0) -> None:
        self.bus = bus
        self.retries = retries
        self.first_pause = first_pause
        self.maxlen = maxlen
        self.dropped = 0
        self._items: list[Outgoing] = []
        self._futs: list[asyncio.Future[None] | _OnError | None] = []
        self._acks: dict[str, list[str]] = {}
        self._task: asyncio.Task[None] | None = None

    def put_nowait(self, channel: str, header: Mapping[str, Any], body: bytes = b"",
                   *, ack: tuple[str, str] | None = None,
                   waiter: asyncio.Future[Any] | None = None) -> None:
        """Queue a message (and the ack of the message it answers, sent after it). If it
        is never sent, ``waiter`` (when given and not done) gets the :class:`BusError`;
        nothing is set on it when it is sent."""
        self._items.append((channel, header, body))
        self._futs.append(None if waiter is None else _OnError(waiter))
        if ack is not None:
            self._acks.setdefault(ack[0], []).append(ack[1])
        self._kick()

    def ack_nowait(self, channel: str, mid: str) -> None:
        self._acks.setdefault(channel, []).append(mid)
        self._kick()

    async def put(self, channel: str, header: Mapping[str, Any], body: bytes = b"") -> None:
        """Queue a message and wait until it was sent (:class:`BusError` if it never was)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._items.append((channel, header, body))
        self._futs.append(fut)
        self._kick()
        await fut

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._items or self._acks:
            items, futs, acks = self._items, self._futs, self._acks
            self._items, self._futs, self._acks = [], [], {}
            error: BusError | None = None
            pause = self.first_pause
            for attempt in range(self.retries + 1):
                try:
                    # the acks ride in the same trip: after the sends, so a send that
                    # failed never leaves its command acked
                    await self.bus.send_many(items, maxlen=self.maxlen, ack=acks)
                    error = None
                    break
                except BusError as exc:
                    error = exc
                    if attempt < self.retries:
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 2.0)
            for fut in futs:
                if fut is None:
                    continue
                if isinstance(fut, _OnError):
                    if error is not None and not fut.waiter.done():
                        fut.waiter.set_exception(error)
                elif not fut.done():
                    if error is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(error)
            if error is not None:
                self.dropped += sum(1 for f in futs if f is None)
                # unacked: the commands stay pending, handed to another reader or again

    async def drain(self) -> None:
        """Wait until everything queued so far was sent (or given up)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

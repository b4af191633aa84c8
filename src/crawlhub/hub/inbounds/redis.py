"""Redis inbound: messages from a Redis list or a Redis stream, at least once.

A list is consumed with LMOVE into a per-inbound processing list, removed only after the
hub took the message, and recovered on start. A stream is read with a consumer group
and XACKed after delivery; entries another consumer left pending are claimed back.
A message that is not a JSON object, or one the hub keeps refusing, is set aside on the
dead list ``<key>:dead:<inbound>``, counted (``crawlhub_stream_entries_rejected_total``,
stream ``inbound:redis``) and logged once: it never stops the inbound.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
from typing import Any

from crawlhub.core import jsoncodec, rejects
from crawlhub.hub.inbounds.base import Deliver

log = logging.getLogger("crawlhub.hub.inbounds.redis")


class RedisInbound:
    """init: ``url``, ``key``, ``type: list|stream`` (default list), ``batch`` (100),
    stream only: ``group`` (default ``crawlhub-<name>``), ``consumer``, ``claim_idle``
    (seconds before another consumer's pending entries are claimed, default 60).
    ``stream: NAME`` (or ``list: NAME``) is short for ``key: NAME`` with that type."""

    def __init__(self, name: str, init: dict[str, Any], *, threads: int = 1) -> None:
        self.name = name
        shorthand = next((k for k in ("stream", "list") if init.get(k)), None)
        key = init.get("key") or (init[shorthand] if shorthand else None)
        if not init.get("url") or not key:
            raise ValueError("redis inbound needs init.url (redis://host:port/db) and"
                             " init.key (or init.stream / init.list)")
        self.url = str(init["url"])
        self.key = str(key)
        self.kind = str(init.get("type") or (shorthand if not init.get("key") and shorthand
                                             else "list"))
        if self.kind not in ("list", "stream"):
            raise ValueError(f"redis inbound init.type must be 'list' or 'stream', got {self.kind!r}")
        self.batch = int(init.get("batch", 100))
        self.group = str(init.get("group") or f"crawlhub-{name}")
        self.consumer = str(init.get("consumer") or f"{socket.gethostname()}-{os.getpid()}")
        self.claim_idle_ms = int(float(init.get("claim_idle", 60)) * 1000)
        self.block_ms = int(float(init.get("block", 1.0)) * 1000)
        self.threads = max(1, threads)
        self.processing = f"{self.key}:processing:{name}"
        #: Messages the hub kept refusing (not a backend outage) are set aside here.
        self.dead_key = f"{self.key}:dead:{name}"

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        from crawlhub.backends.redis import SOCKET_TIMEOUT, redis_client

        # a blocking read (BLMOVE, XREADGROUP) must end before the socket times out
        client = redis_client(self.url, name=f"inbound {self.key!r}",
                              socket_timeout=SOCKET_TIMEOUT + self.block_ms / 1000)
        try:
            if self.kind == "list":
                # What a crashed run took but never delivered goes first, before any
                # consumer starts adding to the processing list.
                await self._recover_list(client, deliver, stop)
                await asyncio.gather(*(self._run_list(client, deliver, stop)
                                       for _ in range(self.threads)))
            else:
                await asyncio.gather(*(
                    self._run_stream(client, deliver, stop,
                                     self.consumer if i == 0 else f"{self.consumer}-{i}")
                    for i in range(self.threads)))
        finally:
            await client.aclose()

    async def _recover_list(self, client: Any, deliver: Deliver, stop: asyncio.Event) -> None:
        while not stop.is_set():
            pending = await client.lrange(self.processing, 0, self.batch - 1)
            if not pending:
                return
            await self._deliver_list(client, pending, deliver)

    async def _run_list(self, client: Any, deliver: Deliver, stop: asyncio.Event) -> None:
        while not stop.is_set():
            first = await client.blmove(self.key, self.processing, self.block_ms / 1000,
                                        "RIGHT", "LEFT")
            if first is None:
                continue
            raws = [first]
            while len(raws) < self.batch:
                more = await client.lmove(self.key, self.processing, "RIGHT", "LEFT")
                if more is None:
                    break
                raws.append(more)
            await self._deliver_list(client, raws, deliver)

    async def _deliver_list(self, client: Any, raws: list[bytes], deliver: Deliver) -> None:
        poison = await _deliver_guarded(deliver, raws, self.name, self.dead_key)
        async with client.pipeline(transaction=False) as pipe:
            for raw in poison:
                pipe.lpush(self.dead_key, raw)
            for raw in raws:
                pipe.lrem(self.processing, 1, raw)
            await pipe.execute()

    async def _run_stream(self, client: Any, deliver: Deliver, stop: asyncio.Event,
                          consumer: str) -> None:
        import redis.exceptions

        try:  # every consumer tries; BUSYGROUP means another already made it
            await client.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        # Our own pending entries first (a restart), then new ones; claim abandoned ones.
        cursor = "0"
        while not stop.is_set():
            if cursor == ">":
                await self._claim(client, deliver, consumer)
            reply = await client.xreadgroup(self.group, consumer, {self.key: cursor},
                                            count=self.batch,
                                            block=self.block_ms if cursor == ">" else None)
            entries = reply[0][1] if reply else []
            if cursor != ">" and not entries:
                cursor = ">"
                continue
            if entries:
                await self._deliver_stream(client, entries, deliver)

    async def _claim(self, client: Any, deliver: Deliver, consumer: str) -> None:
        reply = await client.xautoclaim(self.key, self.group, consumer,
                                        min_idle_time=self.claim_idle_ms, start_id="0-0",
                                        count=self.batch)
        entries = [e for e in reply[1] if e and e[1] is not None] if reply else []
        if entries:
            await self._deliver_stream(client, entries, deliver)

    async def _deliver_stream(self, client: Any, entries: list[Any], deliver: Deliver) -> None:
        raws = [r for r in (_stream_payload(fields) for _, fields in entries) if r is not None]
        poison = await _deliver_guarded(deliver, raws, self.name, self.dead_key)
        async with client.pipeline(transaction=True) as pipe:
            for raw in poison:
                pipe.lpush(self.dead_key, raw)
            pipe.xack(self.key, self.group, *[eid for eid, _ in entries])
            await pipe.execute()


def _transient_errors() -> tuple[type[BaseException], ...]:
    import sqlite3

    import redis.exceptions

    return (ConnectionError, OSError, TimeoutError, sqlite3.OperationalError,
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


#: Errors that mean a backend is down: the batch is retried, never set aside.
_TRANSIENT = _transient_errors()


async def _deliver_guarded(deliver: Deliver, raws: list[bytes], name: str,
                           dead: str = "") -> list[bytes]:
    """Deliver a batch; if the hub refuses it for a reason other than a backend being
    down, deliver one by one and return the messages it keeps refusing (poison), which
    the caller sets aside on the dead list instead of retrying them forever. Messages
    that are not JSON objects are poison from the start (counted as malformed)."""
    poison: list[bytes] = []
    decoded: list[tuple[bytes, dict[str, Any]]] = []
    for raw in raws:
        try:
            decoded.append((raw, _decode_one(raw)))
        except (ValueError, TypeError, RecursionError) as exc:
            rejects.rejected("inbound:redis", f"{name}:{_digest(raw)}", rejects.MALFORMED,
                             f"inbound {name}: {exc}: {raw[:200]!r}", dead=dead)
            poison.append(raw)
    if not decoded:
        return poison
    try:
        await deliver([m for _, m in decoded])
        return poison
    except _TRANSIENT:
        raise
    except Exception:
        log.warning("inbound %s: a batch of %d failed; retrying one by one", name,
                    len(decoded))
    for raw, message in decoded:
        try:
            await deliver([message])
        except _TRANSIENT:
            raise
        except Exception as exc:
            rejects.rejected("inbound:redis", f"{name}:{_digest(raw)}", "refused",
                             f"inbound {name}: the hub refuses it ({type(exc).__name__}:"
                             f" {exc}): {raw[:200]!r}", dead=dead)
            poison.append(raw)
    return poison


def _digest(raw: bytes) -> str:
    """A short name for a list message (lists have no ids): its content's hash."""
    return hashlib.blake2b(raw, digest_size=6).hexdigest()


def _stream_payload(fields: dict[bytes, bytes]) -> bytes | None:
    """A stream entry carries the JSON in field ``data`` (or ``message``/``task``)."""
    for name in (b"data", b"message", b"task", b"json"):
        if name in fields:
            return fields[name]
    if fields:  # not UTF-8: replaced, and the hub (or its converters) judge the text
        return json.dumps({k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                           for k, v in fields.items()}).encode()
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decode_one(raw: bytes) -> dict[str, Any]:
    """The message as a JSON object; ValueError (or RecursionError) if it is not one."""
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    jsoncodec.check_depth(value, "the message")
    return value

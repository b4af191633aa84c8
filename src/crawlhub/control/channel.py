"""Pause, continue and exit per job: the desired state stored in the control database and
announced to whoever follows the job (its runner), in process or over Redis pub/sub.

    channel = await open_channel(config, db)
    await channel.set("nightly", "pause")        # stored, then announced
    await channel.get("nightly")                 # "pause" - after a restart too
    async for state in channel.watch("nightly"): # the state now, then every change
        ...
    async with ControlFileWriter(channel, "nightly", run_dir / "control.json"):
        ...  # the job process runs with CRAWLHUB_CONTROL_FILE pointing there

The stored row is the truth; the announcement only makes a change fast. A watcher also
re-reads the row every :data:`REREAD` seconds, so a message lost while Redis was down (or
while a subscriber reconnected) delays a change by that much and never loses it. Redis
carries one channel per job (``<prefix>control:<job>``, the seed's "the job subscribes to
its name"); a process listens to all of them on one connection (PSUBSCRIBE).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from crawlhub.backends.errors import is_unavailable
from crawlhub.control.db import ControlDB
from crawlhub.core import keys, rejects
from crawlhub.core.errors import CrawlhubError
from crawlhub.core.jobprotocol import RUN, STATES, write_json_atomic
from crawlhub.core.signing import MAX_SKEW, Signer, warn_unsigned
from crawlhub.sdk import Control

if TYPE_CHECKING:
    from crawlhub.config.schema import CrawlhubConfig

log = logging.getLogger("crawlhub.control.channel")

#: The channel name announcements are signed under (one for every job: the job is in
#: the signed data).
_SIGNED_AS = "control"


def _canonical(data: dict[str, Any]) -> bytes:
    """The bytes an announcement's signature covers."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

#: Seconds between two reads of a watched job's stored state (the safety net under the
#: announcements).
REREAD = 2.0
#: The same without a broker (embedded): the only way a change made by another process
#: (``crawlhub jobs pause`` beside ``crawlhub serve``) arrives, so within a second.
REREAD_EMBEDDED = 0.5
#: Longest job name the channel takes (characters).
MAX_JOB = 200
#: Seconds between two attempts to subscribe again after the broker failed (doubling).
RESUBSCRIBE_FIRST, RESUBSCRIBE_MAX = 0.1, 2.0


class ControlError(CrawlhubError, ValueError):
    """A state or a job name the control channel cannot take; the message says which."""


@dataclass(frozen=True, slots=True)
class JobState:
    """A job's desired state and when it was set (unix time; stored ``changed_at`` only
    grows for one job, so the newer of two is the larger)."""

    job: str
    state: str
    changed_at: float


def check_state(state: object) -> str:
    if not isinstance(state, str) or state not in STATES:
        raise ControlError(f"unknown control state {state!r}: use one of"
                           f" {', '.join(STATES)} (run continues, pause holds, exit stops)")
    return state


def check_job(job: object) -> str:
    if not isinstance(job, str) or not job:
        raise ControlError(f"job name {job!r}: give the job's name, a non-empty string")
    if len(job) > MAX_JOB:
        raise ControlError(f"job name {job[:40]!r}... is {len(job)} characters long; the"
                           f" control channel takes at most {MAX_JOB}")
    if any(ord(c) < 32 or ord(c) == 127 for c in job):
        raise ControlError(f"job name {job!r} holds control characters; use printable ones")
    return job


class Notifier(Protocol):
    """How a channel tells other processes about a change (Redis), and hears theirs."""

    async def publish(self, change: JobState) -> None:
        """Announce ``change``; a broker error raises (the caller logs it)."""
        ...

    def listen(self, deliver: Callable[[str, JobState | None], None],
               resync: Callable[[], None]) -> None:
        """Start hearing announcements (once; later calls do nothing): ``deliver(job,
        change)`` for each (``change`` None: something arrived for ``job``, read it
        again), ``resync()`` after each (re)subscription (messages may have been missed).
        Broker outages are retried for ever, never raised."""
        ...

    async def close(self) -> None: ...


class _Watcher:
    """One ``changes()`` generator's mailbox."""

    __slots__ = ("event", "pushed", "reread")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.pushed: JobState | None = None
        self.reread = False


class ControlChannel:
    """The desired state of every job (``run`` when never set), stored in table
    ``job_control`` of the control database; changes announced by ``notifier`` (None: in
    this process only). Watchers of this process hear this process's changes at once."""

    def __init__(self, db: ControlDB, notifier: Notifier | None = None, *,
                 reread: float = REREAD) -> None:
        self.db = db
        self.notifier = notifier
        self.reread = reread
        self.table = db.table("job_control")
        self._watchers: dict[str, set[_Watcher]] = {}

    @property
    def distributed(self) -> bool:
        return self.notifier is not None

    async def open(self) -> None:
        """Create the table when missing."""
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {self.table} (job TEXT PRIMARY KEY,"
            " state TEXT NOT NULL, changed_at DOUBLE PRECISION NOT NULL)"])

    async def close(self) -> None:
        if self.notifier is not None:
            await self.notifier.close()

    # -- the stored state -----------------------------------------------------------------
    async def set(self, job: str, state: str) -> JobState:
        """Store ``state`` as ``job``'s desired state, then announce it. An announcement
        the broker refused is logged, not raised: the stored state reaches watchers at
        their next re-read."""
        check_job(job)
        check_state(state)
        t = self.table
        # changed_at only grows per job (clocks of two hosts may disagree): the newer
        # change is always the larger, whichever way messages and reads arrive
        row = await self.db.fetchone(
            f"INSERT INTO {t} (job, state, changed_at) VALUES ($1, $2, $3)"
            f" ON CONFLICT (job) DO UPDATE SET state = excluded.state, changed_at ="
            f" CASE WHEN excluded.changed_at > {t}.changed_at THEN excluded.changed_at"
            f" ELSE {t}.changed_at + 0.001 END RETURNING changed_at",
            job, state, time.time())
        assert row is not None
        change = JobState(job, state, float(row[0]))
        self._deliver(job, change)
        if self.notifier is not None:
            try:
                await self.notifier.publish(change)
            except Exception as exc:
                log.warning("control: job %r is now %r in the store, but announcing it"
                            " failed (%s: %s); its runner reads it within %g s",
                            job, state, type(exc).__name__, exc, self.reread)
        return change

    async def get(self, job: str) -> str:
        """``job``'s stored desired state (``run`` when never set)."""
        return (await self.read(job)).state

    async def read(self, job: str) -> JobState:
        check_job(job)
        row = await self.db.fetchone(
            f"SELECT state, changed_at FROM {self.table} WHERE job = $1", job)
        if row is None or row[0] not in STATES:
            return JobState(job, RUN, 0.0)
        return JobState(job, str(row[0]), float(row[1]))

    async def states(self) -> dict[str, JobState]:
        """Every job whose state was ever set, by name (a page of jobs reads them once)."""
        rows = await self.db.fetch(f"SELECT job, state, changed_at FROM {self.table}")
        return {str(j): JobState(str(j), str(s), float(c)) for j, s, c in rows if s in STATES}

    async def forget(self, job: str) -> None:
        """Drop ``job``'s stored state (the job was deleted)."""
        check_job(job)
        await self.db.execute(f"DELETE FROM {self.table} WHERE job = $1", job)

    # -- following a job ------------------------------------------------------------------
    async def watch(self, job: str) -> AsyncIterator[str]:
        """``job``'s state now, then each new state (a repeat of the same one is not
        yielded). Broker or database outages after the first read are logged and waited
        out, never raised."""
        async for change in self.changes(job):
            yield change.state

    async def changes(self, job: str) -> AsyncGenerator[JobState, None]:
        """:meth:`watch` with the time of each change. The first read's errors (the
        database is down) reach the caller: nothing is known yet."""
        check_job(job)
        watcher = _Watcher()
        self._watchers.setdefault(job, set()).add(watcher)
        try:
            if self.notifier is not None:
                self.notifier.listen(self._deliver, self._resync)
            current = await self.read(job)
            yield current
            failing = False
            while True:
                try:
                    async with asyncio.timeout(self.reread):
                        await watcher.event.wait()
                except TimeoutError:
                    watcher.reread = True
                watcher.event.clear()
                pushed, watcher.pushed = watcher.pushed, None
                candidate = pushed
                if pushed is None or watcher.reread:
                    watcher.reread = False
                    try:
                        candidate = await self.read(job)
                    except Exception as exc:
                        if not is_unavailable(exc):
                            raise
                        if not failing:
                            log.warning("control: reading the state of job %r failed (%s);"
                                        " trying again every %g s", job, exc, self.reread)
                        failing = True
                        candidate = pushed
                    else:
                        if failing:
                            log.warning("control: the state of job %r is readable again", job)
                        failing = False
                        if pushed is not None and pushed.changed_at > candidate.changed_at:
                            candidate = pushed
                if candidate is None or candidate.changed_at <= current.changed_at:
                    continue
                previous, current = current, candidate
                if candidate.state != previous.state:
                    yield candidate
        finally:
            watchers = self._watchers.get(job)
            if watchers is not None:
                watchers.discard(watcher)
                if not watchers:
                    del self._watchers[job]

    def _deliver(self, job: str, change: JobState | None) -> None:
        for watcher in self._watchers.get(job, ()):
            if change is None:
                watcher.reread = True
            elif watcher.pushed is None or change.changed_at > watcher.pushed.changed_at:
                watcher.pushed = change
            watcher.event.set()

    def _resync(self) -> None:
        for job in list(self._watchers):
            self._deliver(job, None)


class RedisNotifier:
    """Announcements on Redis pub/sub: PUBLISH ``{"job", "state", "changed_at"}`` on the
    job's channel; one PSUBSCRIBE connection per process hears every job. A message that
    is not such an object (a plain ``pause`` from another tool) makes watchers of its job
    read the stored state again. With a ``signer`` every announcement carries ``sig``
    (``{"t", "s"}``, :mod:`crawlhub.core.signing`); one unsigned or badly signed, or stamped
    more than ``max_skew`` ahead, is only a hint to read the stored state again - so a
    forged one cannot pause a job, nor freeze its state with a far-future stamp. Those
    and malformed ones are counted and logged (:mod:`crawlhub.core.rejects`)."""

    def __init__(self, url: str, *, prefix: str = keys.DEFAULT_PREFIX,
                 signer: Signer | None = None) -> None:
        from crawlhub.backends.redis import redis_client

        self.url = url
        self.prefix = prefix
        self.signer = signer
        self.dead_key = keys.dead_stream(prefix, "control")
        self.client = redis_client(url, name="control channel")
        if signer is None:
            warn_unsigned(url)
        self._stem = keys.control_channel(prefix, "")
        self._task: asyncio.Task[None] | None = None

    async def publish(self, change: JobState) -> None:
        data: dict[str, Any] = {"job": change.job, "state": change.state,
                                "changed_at": change.changed_at}
        if self.signer is not None:
            t, sig = self.signer.sign(_SIGNED_AS, _canonical(data))
            data["sig"] = {"t": t.decode(), "s": sig.decode()}
        payload = json.dumps(data)
        await self.client.publish(keys.control_channel(self.prefix, change.job), payload)

    def listen(self, deliver: Callable[[str, JobState | None], None],
               resync: Callable[[], None]) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(deliver, resync),
                                             name="crawlhub control channel")

    async def _listen(self, deliver: Callable[[str, JobState | None], None],
                      resync: Callable[[], None]) -> None:
        pattern = keys.control_pattern(self.prefix)
        delay = RESUBSCRIBE_FIRST
        down = False
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(pattern)
                if down:
                    log.warning("control: subscribed to the control channels again")
                down, delay = False, RESUBSCRIBE_FIRST
                resync()  # what was announced while we were away is read from the store
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                       timeout=1.0)
                    if message is not None:
                        bad = self._heard(message, deliver)
                        if bad is not None:
                            await self._set_aside(*bad)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _raise_if_cancelled()
                if not down:
                    log.warning("control: the control channel's broker failed (%s: %s);"
                                " subscribing again with backoff, stored states are read"
                                " meanwhile", type(exc).__name__, exc)
                down = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESUBSCRIBE_MAX)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _heard(self, message: dict[str, Any], deliver: Callable[[str, JobState | None], None]
               ) -> tuple[str, str, str, Any] | None:
        """Deliver one announcement; ``(channel, reason, detail, data)`` when it was
        rejected (delivered as a hint to read the stored state again)."""
        channel = message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        if not isinstance(channel, str) or not channel.startswith(self._stem):
            return None
        job = channel[len(self._stem):]
        raw = message.get("data") or b""
        try:
            data = json.loads(raw)
        except (TypeError, ValueError, RecursionError):
            data = None
        refused: tuple[str, str] | None = None
        if not (isinstance(data, dict) and data.get("state") in STATES
                and isinstance(data.get("changed_at"), int | float)):
            refused = rejects.MALFORMED, "not a {job, state, changed_at} object"
        elif (ahead := data["changed_at"] - time.time()) > self._max_skew:
            refused = rejects.SKEW, f"changed_at {ahead:.0f} s ahead of this clock"
        elif self.signer is not None:
            sig = data.pop("sig", None)
            if not isinstance(sig, dict):
                refused = rejects.UNSIGNED, "no signature and a key is configured"
            else:
                t, s = sig.get("t"), sig.get("s")
                refused = self.signer.verify(
                    _SIGNED_AS, _canonical(data), b"",
                    t.encode() if isinstance(t, str) else None,
                    s.encode() if isinstance(s, str) else None)
        if refused is not None:
            deliver(job, None)  # the stored row is the truth: read it again
            return channel, *refused, raw
        deliver(job, JobState(job, str(data["state"]), float(data["changed_at"])))
        return None

    @property
    def _max_skew(self) -> float:
        return self.signer.max_skew if self.signer is not None else MAX_SKEW

    async def _set_aside(self, channel: str, reason: str, detail: str, raw: Any) -> None:
        rejects.rejected("control", channel, reason, detail, dead=self.dead_key)
        try:
            fields: Any = rejects.dead_fields(channel, "-", reason, detail, {"data": raw})
            await self.client.xadd(self.dead_key, fields, maxlen=rejects.DEAD_MAXLEN,
                                   approximate=True)
        except Exception as exc:  # noqa: BLE001 - keeping it aside is best effort
            log.debug("control: could not keep a rejected announcement: %s", exc)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self.client.aclose()


def _raise_if_cancelled() -> None:
    """A cancel that lands while redis-py reads can come out as a connection error; keep
    it a cancel (``Task.cancelling()`` remembers it)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def open_channel(config: CrawlhubConfig, db: ControlDB) -> ControlChannel:
    """The control channel of ``config``: in process when ``control.channel`` is None
    (or ``memory://``), Redis pub/sub on a ``redis://`` URL (keys under
    ``storage.redis_prefix``). States are stored in ``db`` either way."""
    url = config.control.channel
    notifier: Notifier | None = None
    if url and not url.lower().startswith("memory://"):
        from crawlhub.core.signing import signer_from_config

        notifier = RedisNotifier(url, prefix=config.storage.redis_prefix,
                                 signer=signer_from_config(config))
    channel = ControlChannel(db, notifier,
                             reread=REREAD if notifier is not None else REREAD_EMBEDDED)
    try:
        await channel.open()
    except BaseException:
        await channel.close()
        raise
    return channel


# -- what a runner uses while a run lasts -------------------------------------------------
class ControlFollower:
    """Follows ``job``'s desired state while a run lasts::

        async with ControlFollower(channel, job) as follower:
            follower.state          # "run" | "pause" | "exit", kept current
            follower.control        # the same as a crawlhub.sdk.Control (in-process runs)

    ``on_change(change)`` is called with the current state before ``__aenter__`` returns
    (a run that starts while its job is paused starts paused), then on every change; an
    error in it is logged and following goes on.
    """

    def __init__(self, channel: ControlChannel, job: str,
                 on_change: Callable[[JobState], None] | None = None) -> None:
        self.channel = channel
        self.job = check_job(job)
        self.on_change = on_change
        self.current = JobState(job, RUN, 0.0)
        self.control = Control.from_callable(lambda: self.current.state)
        self._changes: AsyncGenerator[JobState, None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def state(self) -> str:
        return self.current.state

    async def __aenter__(self) -> ControlFollower:
        changes = self.channel.changes(self.job)
        self._changes = changes
        try:
            first = await anext(changes)
            self._apply(first)
        except BaseException:
            await changes.aclose()
            raise
        self._task = asyncio.create_task(self._follow(changes),
                                         name=f"crawlhub control of {self.job}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        changes, self._changes = self._changes, None
        if changes is not None:
            with contextlib.suppress(Exception):
                await changes.aclose()

    async def _follow(self, changes: AsyncGenerator[JobState, None]) -> None:
        try:
            async for change in changes:
                self._apply(change)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("control: following job %r stopped", self.job)

    def _apply(self, change: JobState) -> None:
        self.current = change
        if self.on_change is None:
            return
        try:
            self.on_change(change)
        except Exception:
            log.exception("control: applying state %r of job %r failed", change.state,
                          self.job)


class ControlFileWriter(ControlFollower):
    """Keeps a run's control file (``CRAWLHUB_CONTROL_FILE``) at ``job``'s desired state::

        async with ControlFileWriter(channel, job, run_dir / "control.json"):
            ...  # start the process; pause / continue / exit reach it through the file

    The file ``{"state": ..., "changed_at": ...}`` is written (atomically) before
    ``__aenter__`` returns, then rewritten on every change."""

    def __init__(self, channel: ControlChannel, job: str, path: str | Path) -> None:
        super().__init__(channel, job, self._write)
        self.path = Path(path)

    def _write(self, change: JobState) -> None:
        write_json_atomic(self.path, {"state": change.state, "changed_at": change.changed_at})

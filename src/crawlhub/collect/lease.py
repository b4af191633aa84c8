"""Run exclusivity across processes: one lease row per job in the metadata store.

A run takes its job's lease before its first request and renews it while it runs (a
heartbeat every ``ttl / 3``), so the CLI and any number of servers never run one job at
once. A holder killed with SIGKILL blocks nobody for longer than ``ttl``, and not at all
on its own host, where a dead pid is seen at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable

from crawlhub.collect.store.base import Lease, MetadataStore
from crawlhub.core.errors import ConflictError
from crawlhub.core.process import pid_alive
from crawlhub.fetch.cancel import CancellationToken
from crawlhub.fetch.joblog import JobLog

#: Seconds a lease lasts without a heartbeat (a SIGKILLed run blocks its job this long
#: at most when the next runner is on another host).
DEFAULT_LEASE_TTL = 30.0


class JobConflict(ConflictError):
    """The job cannot start now: already running, or disabled (the API answers 409)."""


class JobRunning(JobConflict):
    """The job's lease is held by a run elsewhere (another process, or this one)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        run = f" (run {lease.run_id})" if lease.run_id else ""
        super().__init__(
            f"job {lease.job!r} is already running in pid {lease.pid} on host {lease.host} "
            f"since {_utc(lease.since)}{run}; stop it (crawlhub's POST /jobs/{lease.job}/stop "
            f"or Ctrl-C there) or wait for it to end; if that process is gone, its lease "
            f"expires at {_utc(lease.expires_at)}"
        )


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def is_live(lease: Lease, now: float) -> bool:
    """Whether ``lease`` still stands: not expired, and its process alive if on this host."""
    if lease.expires_at <= now:
        return False
    if lease.host == socket.gethostname() and lease.pid != os.getpid():
        return pid_alive(lease.pid, zombie_is_alive=True)
    return True


class RunLease:
    """The lease of one run: ``await acquire()`` (or :class:`JobRunning`), ``keep(token)``
    while running, ``await release()`` at the end.

    The heartbeat cancels ``token`` when the lease is lost (taken over after the store was
    out of reach for longer than ``ttl``) or when someone asked the job to stop.
    """

    def __init__(
        self,
        store: MetadataStore,
        job: str,
        run_id: str,
        *,
        ttl: float = DEFAULT_LEASE_TTL,
        clock: Callable[[], float] = time.time,
        log: JobLog | None = None,
        pid: int | None = None,
        host: str | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"lease ttl must be > 0 seconds, got {ttl!r}")
        self.store = store
        self.job = job
        self.run_id = run_id
        self.ttl = ttl
        self.interval = ttl / 3
        self.clock = clock
        self.log = log
        self.pid = os.getpid() if pid is None else pid
        self.host = socket.gethostname() if host is None else host
        self.owner = f"{self.host}:{self.pid}:{run_id}:{uuid.uuid4().hex[:8]}"
        self.current: Lease | None = None  # the lease while we hold it
        self._last_renewal = 0.0

    @property
    def held(self) -> bool:
        return self.current is not None

    async def acquire(self) -> Lease:
        """Take the job's lease; :class:`JobRunning` naming the holder when it is taken."""
        holder = await self._take(None)
        if holder.owner != self.owner and holder.host == self.host and holder.pid != self.pid:
            if not pid_alive(holder.pid, zombie_is_alive=True):  # killed on this host: no need to wait for expiry
                if self.log is not None:
                    self.log.warning("run lease of a dead process taken over",
                                     pid=holder.pid, previous_run=holder.run_id)
                holder = await self._take(holder.owner)
        if holder.owner != self.owner:
            raise JobRunning(holder)
        self.current = holder
        self._last_renewal = self.clock()
        return holder

    async def _take(self, take_from: str | None) -> Lease:
        return await self.store.acquire_lease(
            self.job, self.owner, run_id=self.run_id, pid=self.pid, host=self.host,
            now=self.clock(), ttl=self.ttl, take_from=take_from,
        )

    async def beat(self, token: CancellationToken) -> None:
        """One heartbeat: renew; cancel ``token`` on a stop request or a lost lease."""
        now = self.clock()
        try:
            lease = await self.store.renew_lease(self.job, self.owner, now=now, ttl=self.ttl)
        except Exception as exc:  # the store is out of reach: the run may go on a while
            if now - self._last_renewal >= self.ttl:
                self._lost(token, f"metadata store unreachable for {self.ttl:g}s ({exc})")
            elif self.log is not None:
                self.log.warning("run lease not renewed, retrying", error=str(exc))
            return
        if lease is None:
            self._lost(token, "another process took it over")
            return
        self.current = lease
        self._last_renewal = now
        if lease.stop and not token.is_cancelled:
            if self.log is not None:
                self.log.warning("stop requested through the metadata store", reason=lease.stop)
            token.cancel(lease.stop)

    def _lost(self, token: CancellationToken, why: str) -> None:
        self.current = None
        if self.log is not None:
            self.log.error("run lease lost, stopping", reason=why)
        token.cancel(f"run lease of job {self.job!r} lost: {why}")

    @contextlib.asynccontextmanager
    async def keep(self, token: CancellationToken) -> AsyncIterator[None]:
        """Heartbeat in the background for the duration of the block."""

        async def loop() -> None:
            while self.current is not None:
                await asyncio.sleep(self.interval)
                await self.beat(token)

        task = asyncio.create_task(loop(), name=f"lease:{self.job}")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def release(self) -> None:
        """Give the lease up (only if still ours)."""
        if self.current is not None:
            self.current = None
            await self.store.release_lease(self.job, self.owner)

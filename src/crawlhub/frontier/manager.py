"""The Frontier: admits seeds once per time segment and dispatches them with leases.

Above the store protocol: key resolution, segments, the in-memory dispatch cache,
the timed wake-up, snapshots on an interval and on close, and the hub's admit_task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from crawlhub.core.errors import FrontierError
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.frontier.bloom import stable_hash
from crawlhub.frontier.config import FrontierConfig
from crawlhub.frontier.open import open_store
from crawlhub.frontier.seed import OUTCOMES, Outcome, Seed
from crawlhub.frontier.segments import SegmentResolver, TimeSegments, segment_resolver
from crawlhub.frontier.store import Entry, SeedStore
from crawlhub.frontier.urlkeys import KeyResolver

if TYPE_CHECKING:
    from crawlhub.config.schema import CrawlhubConfig

log = logging.getLogger("crawlhub.frontier")

#: Seeds per store call when admitting a long list (bounds each transaction / script).
ADMIT_BATCH = 1000


class Frontier:
    """One named frontier over a :class:`SeedStore`.

    Callers: the hub (``admit_task`` before routing a task), ``crawlhub frontier add``
    and the API (``admit``, ``stats``), and dispatchers (``wait_ready``, ``lease``,
    ``finish``). Stats names: admitted, duplicates, pending, leased, done, failed,
    dispatched, per segment.
    """

    def __init__(
        self,
        name: str,
        store: SeedStore,
        config: FrontierConfig | None = None,
        *,
        keys: KeyResolver | None = None,
        segments: SegmentResolver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.store = store
        self.config = config = config or FrontierConfig()
        self.keys = keys or KeyResolver(config.key)
        self.segments = segments or segment_resolver(config)
        self.clock = clock
        self._cache: deque[Seed] = deque()
        self._wakeup = asyncio.Event()
        self._snapshotter: asyncio.Task[None] | None = None
        self._open = False
        self._closed = False
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<Frontier {self.name!r} {self.store!r}>"

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Open the store (restoring the filter) and start the snapshot timer."""
        async with self._lock:
            if self._open:
                return
            if self._closed:
                raise FrontierError(f"frontier {self.name!r} is closed; build a new one")
            await self.store.open()
            self._open = True
            if self.config.snapshot_interval > 0:
                self._snapshotter = asyncio.create_task(
                    self._snapshot_loop(), name=f"frontier-{self.name}-snapshot"
                )

    async def close(self) -> None:
        """Return cached leases, snapshot the filter, close the store."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._snapshotter is not None:
                self._snapshotter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._snapshotter
            if self._open:
                try:
                    if self._cache:
                        await self.store.release(list(self._cache))
                        self._cache.clear()
                    await self.store.snapshot(self.current_segment())
                finally:
                    await self.store.close()

    async def __aenter__(self) -> Frontier:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _ensure_open(self) -> None:
        if not self._open:
            await self.open()

    async def snapshot(self) -> None:
        """Persist the dedup filter now (also done every ``snapshot_interval``)."""
        await self._ensure_open()
        await self.store.snapshot(self.current_segment())

    async def _snapshot_loop(self) -> None:
        interval = self.config.snapshot_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await self.snapshot()
                if self.config.retain_segments:
                    before = self.current_segment() - self.config.retain_segments
                    gone = await self.store.prune(before)
                    if gone:
                        log.info("frontier %s pruned segments %s", self.name, gone)
            except Exception:
                log.exception("frontier %s: snapshot failed; retrying in %ss", self.name, interval)

    # ------------------------------------------------------------------ admission
    def current_segment(self) -> int:
        return self.segments.segment_of(None, self.clock())

    def entry(self, seed: Seed, now: float, *, dispatched: bool = False) -> Entry:
        """Resolve ``seed``'s key, segment and ready time (no I/O)."""
        key = self.keys.key(seed)
        segment = self.segments.segment_of(seed, now)
        ready_at = max(self.segments.start_of(segment), seed.not_before or 0.0)
        return Entry(seed, segment, key, stable_hash(key), ready_at, dispatched)

    def entries(self, seeds: Sequence[Seed], now: float, *, dispatched: bool = False) -> list[Entry]:
        """``entry`` of every seed, the segment worked out once for those without
        ``not_before`` when segments are plain time spans."""
        if type(self.segments) is not TimeSegments:  # a resolver may look at each seed
            return [self.entry(seed, now, dispatched=dispatched) for seed in seeds]
        segment = self.segments.segment_of(None, now)
        start = self.segments.start_of(segment)
        key_of = self.keys.key
        out = []
        for seed in seeds:
            if seed.not_before is None:
                key = key_of(seed)
                out.append(Entry(seed, segment, key, stable_hash(key), start, dispatched))
            else:
                out.append(self.entry(seed, now, dispatched=dispatched))
        return out

    async def admit(self, seeds: Sequence[Seed], *, dispatched: bool = False) -> list[bool]:
        """Admit seeds: True = new in its segment and stored pending, False = duplicate.

        An admitted seed gets its ``key`` and ``segment`` set. Each batch of
        ``ADMIT_BATCH`` seeds is one atomic store call; an invalid URL raises a
        FrontierError naming it (batches before it stay admitted). ``dispatched``: the
        seeds are recorded as dispatched (their key remembered; the caller runs them,
        the frontier never leases them).
        """
        await self._ensure_open()
        results: list[bool] = []
        exact = self.config.exact
        # Batch after batch, each resolved whole before it is stored (a bad URL fails its
        # batch, nothing of it admitted). Resolving the next batch while the SQLite thread
        # works would only trade the GIL (a hand-over can wait out the 5 ms switch interval).
        for start in range(0, len(seeds), ADMIT_BATCH):
            now = self.clock()
            entries = self.entries(seeds[start : start + ADMIT_BATCH], now, dispatched=dispatched)
            flags = await self.store.admit(entries, now, exact=exact)
            results += self._admitted(entries, now, flags, dispatched)
        return results

    def _admitted(
        self, entries: list[Entry], now: float, flags: list[bool], dispatched: bool
    ) -> list[bool]:
        for e, ok in zip(entries, flags, strict=True):
            if ok:
                e.seed.key, e.seed.segment = e.key, e.segment
                if not dispatched and e.ready_at <= now:
                    self._wakeup.set()
        return flags

    def seed_of_task(self, task: Mapping[str, Any]) -> Seed | None:
        """The seed a task stands for: its ``url_field``, method and body; None: no URL."""
        url = task.get(self.config.url_field)
        if not isinstance(url, str) or not url.strip():
            return None
        method = task.get("method")
        body = task.get("body")
        return Seed(
            url.strip(),
            method=method if isinstance(method, str) and method else "GET",
            body=body if isinstance(body, str | bytes) else None,
            meta={"task_uuid": task["task_uuid"]} if task.get("task_uuid") else {},
        )

    async def admit_task(self, task: Mapping[str, Any]) -> bool | None:
        """Admission of a hub task: None = no URL (not gated), True = admitted (recorded
        as dispatched: the hub routes it, the frontier never leases it), False = a
        duplicate in its segment (counted, not to be routed)."""
        seed = self.seed_of_task(task)
        if seed is None:
            return None
        (admitted,) = await self.admit([seed], dispatched=True)
        return admitted

    async def admit_tasks(self, tasks: Sequence[Mapping[str, Any]]) -> list[bool | None]:
        """``admit_task`` for many tasks in one store call per batch."""
        seeds = [self.seed_of_task(t) for t in tasks]
        present = [s for s in seeds if s is not None]
        flags = iter(await self.admit(present, dispatched=True))
        return [None if s is None else next(flags) for s in seeds]

    def task_entries(self, tasks: Sequence[Mapping[str, Any]], now: float
                     ) -> list[Entry | None]:
        """The store entries of hub tasks (None: no URL, not gated), resolved without
        I/O, so the hub can record which (segment, key) a task holds before it admits.
        An unusable URL raises FrontierError."""
        seeds = [self.seed_of_task(t) for t in tasks]
        found = iter(self.entries([s for s in seeds if s is not None], now, dispatched=True))
        out = [None if s is None else next(found) for s in seeds]
        for e in out:
            if e is not None and not e.key:
                raise FrontierError(f"seed {e.seed.url!r} resolved to an empty key: fix"
                                    f" key.function of frontier {self.name!r}")
        return out

    def gated_entry(self, task: Mapping[str, Any], segment: int, key: str) -> Entry | None:
        """The entry of a hub task in the segment and under the key it was gated with."""
        seed = self.seed_of_task(task)
        if seed is None:
            return None
        return Entry(seed, segment, key, stable_hash(key), self.segments.start_of(segment),
                     True)

    async def admit_entries(self, entries: Sequence[Entry]) -> list[bool]:
        """Admit ``task_entries`` (recorded as dispatched: the hub routes them); True =
        admitted, False = a duplicate in its segment."""
        await self._ensure_open()
        now = self.clock()
        flags: list[bool] = []
        for start in range(0, len(entries), ADMIT_BATCH):
            chunk = list(entries[start : start + ADMIT_BATCH])
            flags += self._admitted(chunk, now, await self.store.admit(
                chunk, now, exact=self.config.exact), True)
        return flags

    async def duplicates(self, entries: Sequence[Entry]) -> list[bool]:
        """Which ``task_entries`` are already admitted in their segments (counted as
        duplicates); a read, for the hub to answer known URLs before recording them."""
        await self._ensure_open()
        flags: list[bool] = []
        for start in range(0, len(entries), ADMIT_BATCH):
            flags += await self.store.duplicates(list(entries[start : start + ADMIT_BATCH]),
                                                 exact=self.config.exact)
        return flags

    async def admitted_by(self, entry: Entry) -> str | None:
        """The ``task_uuid`` of the hub task ``entry``'s key was admitted for."""
        await self._ensure_open()
        return await self.store.admitted_by(entry.segment, entry.key)

    # ------------------------------------------------------------------ dispatch
    async def lease(self, n: int = 1, visibility_timeout: float | None = None) -> list[Seed]:
        """Lease up to ``n`` ready seeds for ``visibility_timeout`` seconds (default
        ``lease_timeout``). Unfinished leases return to pending when they expire.

        Seeds come from an in-memory cache refilled ``cache_size`` at a time; cached
        seeds hold a store lease of twice the visibility timeout, so serving them needs
        no store write while at least ``visibility_timeout`` of it is left.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise FrontierError(f"lease(n={n!r}) on frontier {self.name!r}: n must be an int >= 1")
        vt = self.config.lease_timeout if visibility_timeout is None else visibility_timeout
        if vt <= 0:
            raise FrontierError(
                f"lease on frontier {self.name!r}: visibility_timeout must be > 0, got {vt}"
            )
        await self._ensure_open()
        now = self.clock()
        out: list[Seed] = []
        while self._cache and len(out) < n:
            seed = self._cache.popleft()
            if seed.lease_until is not None and seed.lease_until > now:
                out.append(seed)
            # else: its store lease ran out; the store has taken it back
        want = n - len(out)
        if want:
            batch = max(want, self.config.cache_size)
            hold = vt * 2 if batch > want else vt
            claimed = await self.store.claim(batch, now, now + hold)
            out += claimed[:want]
            self._cache.extend(claimed[want:])
        short = [s for s in out if s.lease_until is None or s.lease_until - now < vt]
        if short:
            kept = await self.extend(short, vt)
            lost = {id(s) for s, ok in zip(short, kept, strict=True) if not ok}
            out = [s for s in out if id(s) not in lost]
        return out

    async def extend(self, seeds: Sequence[Seed], visibility_timeout: float) -> list[bool]:
        """Push the leases of ``seeds`` ``visibility_timeout`` seconds from now (a worker
        still busy with them); False where a seed is no longer leased (its lease ran out
        and it went back to pending, or it finished)."""
        if not seeds:
            return []
        await self._ensure_open()
        until = self.clock() + visibility_timeout
        kept = await self.store.extend(seeds, until)
        for seed, ok in zip(seeds, kept, strict=True):
            if ok:
                seed.lease_until = until
        return kept

    async def release(self, seeds: Sequence[Seed]) -> int:
        """Give leased ``seeds`` back to pending at once, their attempt uncounted (a
        worker closing with seeds it never started)."""
        if not seeds:
            return 0
        await self._ensure_open()
        released = await self.store.release(seeds)
        if released:
            self._wakeup.set()
        return released

    async def finish(self, seed: Seed, outcome: Outcome, *, delay: float = 0.0) -> bool:
        """``ok`` archives the seed as done, ``failed`` as failed, ``retry`` returns it to
        pending (after ``delay`` seconds). Returns False when it was already finished."""
        (changed,) = await self.finish_many([(seed, outcome)], delay=delay)
        return changed

    async def finish_many(
        self, done: Sequence[tuple[Seed, Outcome]], *, delay: float = 0.0
    ) -> list[bool]:
        """``finish`` of every (seed, outcome) in one store call (one round trip on Redis
        per 1000 seeds); False where a seed was already finished."""
        for seed, outcome in done:
            if outcome not in OUTCOMES:
                raise FrontierError(
                    f"finish outcome {outcome!r} on frontier {self.name!r}: use one of"
                    f" {OUTCOMES}"
                )
            if seed.segment is None or seed.key is None:
                raise FrontierError(
                    f"seed {seed.url!r} has no segment/key: finish seeds that admit or lease "
                    f"returned from frontier {self.name!r}"
                )
        if not done:
            return []
        await self._ensure_open()
        now = self.clock()
        ready_at = now + max(0.0, delay)
        if self._cache:  # a cached seed finished meanwhile is not served again
            finished = {(seed.segment, seed.key) for seed, _ in done}
            self._cache = deque(s for s in self._cache if (s.segment, s.key) not in finished)
        changed = await self.store.finish(done, now, ready_at)
        if ready_at <= now and any(
                ok and outcome == "retry" for (_, outcome), ok in zip(done, changed, strict=True)):
            self._wakeup.set()
        return changed

    async def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until a seed can be leased; True when one can.

        Sleeps until the earliest moment a waiting seed opens or a lease expires, or an
        admission in this process (or, on Redis, in any process) signals — no polling.
        """
        await self._ensure_open()
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            self._wakeup.clear()
            if any(s.lease_until is not None and s.lease_until > self.clock() for s in self._cache):
                return True
            now = self.clock()
            due = await self.store.next_due(now)
            if due is not None and due <= now:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            sleep = remaining if due is None else min(remaining, max(due - now, 0.001))
            local = asyncio.ensure_future(self._wakeup.wait())
            remote = asyncio.ensure_future(self.store.wait_signal(sleep))
            try:
                await asyncio.wait({local, remote}, timeout=sleep,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (local, remote):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    # ------------------------------------------------------------------ stats
    async def stats(self) -> list[dict[str, Any]]:
        """Per segment, oldest first: segment, label, start, admitted, duplicates,
        pending, leased, done, failed, dispatched."""
        await self._ensure_open()
        rows = []
        for c in await self.store.counts(self.clock()):
            row = c.as_dict()
            row["label"] = self.segments.label(c.segment)
            row["start"] = self.segments.start_of(c.segment)
            rows.append(row)
        return rows

    async def describe(self) -> dict[str, Any]:
        """Name, backend, current segment, settings and per-segment stats (for the API)."""
        segments = await self.stats()
        totals = {
            name: sum(row[name] for row in segments)
            for name in ("admitted", "duplicates", "pending", "leased", "done", "failed",
                         "dispatched")
        }
        current = self.current_segment()
        return {
            "name": self.name,
            "backend": self.store.url.split("://", 1)[0],
            "current_segment": current,
            "current_label": self.segments.label(current),
            "config": self.config.model_dump(mode="json"),
            "totals": totals,
            "segments": segments,
        }


def build_frontier(
    name: str,
    config: FrontierConfig,
    storage_url: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    clock: Callable[[], float] = time.time,
) -> Frontier:
    """One frontier on ``storage_url`` (not opened yet)."""
    store = open_store(
        storage_url,
        name,
        prefix=prefix,
        expected_items=config.expected_items,
        fp_rate=config.fp_rate,
        archive=config.archive,
    )
    return Frontier(name, store, config, clock=clock)


def open_frontiers(config: CrawlhubConfig) -> dict[str, Frontier]:
    """Every frontier under ``config.frontier`` on ``config.storage.frontier``.

    They are built, not opened: ``await frontier.open()`` each (the first call that
    needs the store opens it too), and ``await frontier.close()`` to snapshot.
    """
    url = config.storage.frontier.replace("{data_dir}", str(config.data_dir))
    out: dict[str, Frontier] = {}
    for name, fc in (config.frontier or {}).items():
        if not isinstance(fc, FrontierConfig):
            fc = FrontierConfig.model_validate(fc or {})
        out[name] = build_frontier(name, fc, url, prefix=config.storage.redis_prefix)
    return out

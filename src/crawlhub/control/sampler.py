"""What the web page's charts are drawn from: every :data:`SAMPLE_EVERY` seconds the
sampler reads each source (outbounds, agents, frontiers, runs) and adds the figures to
the :class:`~crawlhub.control.series.SeriesStore`.

Sources are plain async callables returning :class:`Sample` lists, built here from the
objects that hold the figures and composed in ``services.py``; a source out of reach is
skipped for that tick (and said once in the log), the others still sampled.

What is sampled (scope, subject, metric):

- ``outbound``, its name: ``depth`` (tasks left in its queue) and ``rate`` (tasks
  dispatched per second), gauges;
- ``agent``, its id: ``qps`` and ``memory`` (bytes), gauges, for the live agents;
- ``frontier``, its name: ``admitted@<segment>`` and ``duplicates@<segment>``, counters;
- ``run``, its id: ``pages``, ``items`` and ``errors``, counters read from the run's
  counters (:data:`RUN_METRICS` names which), for the live runs and, once more, the
  runs that ended since the tick before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from crawlhub.control.series import Sample, SeriesStore

if TYPE_CHECKING:
    from crawlhub.agents.registry import AgentRegistry
    from crawlhub.control.jobs import JobStore, RunRecord
    from crawlhub.frontier.manager import Frontier

log = logging.getLogger("crawlhub.control.sampler")

#: Seconds between two samples: four a minute, so a minute's mean is a mean.
SAMPLE_EVERY = 15.0

#: A run's chart metrics and the counters each is read from, first found wins: Scrapy's
#: stats names, then the SDK's and the collection runs' usual ones.
RUN_METRICS: dict[str, tuple[str, ...]] = {
    "pages": ("response_received_count", "pages", "pages_ok", "requests_ok", "success"),
    "items": ("item_scraped_count", "items", "records", "records_processed"),
    "errors": ("log_count/ERROR", "errors", "requests_failed", "failed"),
}

Source = Callable[[], Awaitable[list[Sample]]]


class Sampler:
    """Samples ``sources`` into ``store`` every ``every`` seconds (see the module)."""

    def __init__(self, store: SeriesStore, sources: Mapping[str, Source], *,
                 every: float = SAMPLE_EVERY,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.sources = dict(sources)
        self.every = every
        self.clock = clock
        #: the last value written per counter series: an unchanged counter is not written
        self._written: dict[tuple[str, str, str], float] = {}
        self._failing: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> int:
        """Read every source once and write what it gave; the samples written."""
        samples: list[Sample] = []
        for name, source in self.sources.items():
            try:
                found = await source()
            except Exception as exc:  # one source away must not stop the others
                if name not in self._failing:
                    self._failing.add(name)
                    log.warning("series: the %s could not be sampled (%s: %s); charts miss"
                                " them until it answers", name, type(exc).__name__, exc)
                continue
            if name in self._failing:
                self._failing.discard(name)
                log.info("series: the %s are sampled again", name)
            samples.extend(found)
        fresh = []
        for sample in samples:
            key = (sample.scope, sample.subject, sample.metric)
            if sample.counter and self._written.get(key) == sample.value:
                continue
            fresh.append(sample)
        written = await self.store.record(fresh, at=self.clock())
        for sample in fresh:
            if sample.counter:
                self._written[(sample.scope, sample.subject, sample.metric)] = sample.value
        if len(self._written) > 100_000:  # runs come and go: forget, at worst write again
            self._written.clear()
        return written

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="crawlhub-series")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _loop(self) -> None:
        while True:
            # the first sample one period after the start: a server restarting in a loop
            # adds nothing, and the figures read at its start are not all in yet
            await asyncio.sleep(self.every)
            try:
                await self.tick()
            except Exception as exc:  # the store away: the next tick tries again
                log.warning("series: a sample was not stored (%s: %s)",
                            type(exc).__name__, exc)


# ---------------------------------------------------------------------------- sources
def outbound_source(stats: Callable[[], Awaitable[list[dict[str, Any]]]]) -> Source:
    """Each outbound's depth and dispatch rate, from ``Hub.outbound_stats``; one out of
    reach (``available`` false) is skipped."""

    async def sample() -> list[Sample]:
        out = []
        for row in await stats():
            if not row.get("available", True):
                continue
            name = str(row["name"])
            depth = row.get("left")
            if depth is None:
                depth = row.get("queue_length")
            if depth is not None:
                out.append(Sample("outbound", name, "depth", float(depth)))
            out.append(Sample("outbound", name, "rate", float(row.get("rate") or 0.0)))
        return out

    return sample


def agent_source(registries: Sequence[AgentRegistry]) -> Source:
    """Each live agent's QPS and resident memory, from its last heartbeat (an agent known
    to several registries counted once, as last seen)."""
    from crawlhub.agents.registry import listing

    async def sample() -> list[Sample]:
        if not registries:
            return []
        found = await listing(registries[0], True, registries[1:])
        out = []
        for row in found["agents"]:
            if not row.get("beats", True):
                continue  # registered, no heartbeat yet: its load fields are 0
            agent = str(row["agent_id"])
            out.append(Sample("agent", agent, "qps", float(row.get("qps") or 0.0)))
            out.append(Sample("agent", agent, "memory", float(row.get("memory") or 0)))
        return out

    return sample


#: Segments sampled per frontier: the newest ones (older ones no longer move).
FRONTIER_SEGMENTS = 8


def frontier_source(frontiers: Mapping[str, Frontier]) -> Source:
    """Each frontier's admitted and duplicate seeds per segment (its newest
    :data:`FRONTIER_SEGMENTS`), as counters."""

    async def sample() -> list[Sample]:
        out = []
        for name, frontier in frontiers.items():
            segments = sorted((await frontier.describe())["segments"],
                              key=lambda s: s["segment"])[-FRONTIER_SEGMENTS:]
            for seg in segments:
                for metric in ("admitted", "duplicates"):
                    out.append(Sample("frontier", name, f"{metric}@{seg['segment']}",
                                      float(seg[metric]), counter=True))
        return out

    return sample


def run_figures(run: RunRecord) -> dict[str, float]:
    """A run's pages, items and errors from its counters (:data:`RUN_METRICS`); a
    metric none of whose counters it has is left out."""
    counters = run.counters or {}
    found = {}
    for metric, names in RUN_METRICS.items():
        for name in names:
            value = counters.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found[metric] = float(value)
                break
    return found


def run_source(store: JobStore) -> Source:
    """The live runs' figures, and the final figures of those that ended since the
    tick before (read once each by id)."""
    live_before: set[str] = set()

    async def sample() -> list[Sample]:
        nonlocal live_before
        live = await store.live_runs()
        ids = {run.id for run in live}
        ended = []
        for run_id in sorted(live_before - ids):
            with contextlib.suppress(Exception):  # deleted meanwhile: nothing to add
                ended.append(await store.run(run_id))
        live_before = ids
        return [Sample("run", run.id, metric, value, counter=True)
                for run in (*live, *ended) for metric, value in run_figures(run).items()]

    return sample

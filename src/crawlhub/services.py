"""The running product: every service built from one config, started and stopped together.

``crawlhub serve``, the API app and the tests all build a :class:`Services`; the API and
CLI are thin shells over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crawlhub.agents.registry import AgentRegistry, open_registry
from crawlhub.control.plane import ControlPlane
from crawlhub.core.errors import NotFoundError
from crawlhub.core.redact import redact
from crawlhub.hub.hub import Hub
from crawlhub.hub.state import HubState, open_state
from crawlhub.queues import open_backend
from crawlhub.queues.base import QueueBackend

if TYPE_CHECKING:  # (typing only: these modules load on first use)
    from crawlhub.center.bus import Bus
    from crawlhub.collect.service import CollectJobManager
    from crawlhub.config.schema import CrawlhubConfig
    from crawlhub.control.sampler import Sampler
    from crawlhub.control.series import SeriesStore
    from crawlhub.frontier.manager import Frontier

log = logging.getLogger("crawlhub.service")


class Services:
    """Queues, hub state, hub, frontiers, jobs and the agent registry of one crawlhub
    process (the registry on ``storage.agents``, by default the hub state's backend)."""

    def __init__(self, config: CrawlhubConfig, *, queues: QueueBackend, state: HubState,
                 hub: Hub, frontiers: dict[str, Frontier],
                 jobs: CollectJobManager | None = None,
                 agents: AgentRegistry | None = None,
                 control: ControlPlane | None = None) -> None:
        self.config = config
        self.queues = queues
        self.state = state
        self.agents = agents or open_registry(config.storage.agents_url,
                                              prefix=config.storage.redis_prefix)
        self.hub = hub
        self.frontiers = frontiers
        #: the collection jobs of ``jobs:`` (None when the config has none)
        self.jobs = jobs
        #: the control plane (projects, builds, jobs, runs, logs, alerts); None only for
        #: services built without one (embedding tests of the hub alone)
        self.control = control
        self._started = False
        #: the download center's broker and registry (``center.url``), opened on first use
        self._center_bus: Bus | None = None
        self._center_registry: AgentRegistry | None = None
        self._center_task: asyncio.Task[None] | None = None
        self._center_stop: asyncio.Event | None = None
        #: the charts' per-minute figures in the control store (None without a control
        #: plane), and what samples them while started (``crawlhub.control.sampler``)
        self.series: SeriesStore | None = None
        self._sampler: Sampler | None = None

    @classmethod
    async def open(cls, config: CrawlhubConfig, *, control: bool = True) -> Services:
        """Open every backend named by ``config.storage`` and compile the hub.

        ``control=False`` opens no control plane (jobs, builds, alerts, secrets, the
        charts' store): for a process that serves none of them, such as the one-process
        crawl, which would open their database and key only to close them."""
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        storage = config.storage
        queues = open_backend(storage.queues, prefix=storage.redis_prefix)
        state = open_state(storage.state, prefix=storage.redis_prefix)
        frontiers: dict[str, Frontier] = {}
        if config.frontier:
            from crawlhub.frontier import open_frontiers

            frontiers = open_frontiers(config)
            for frontier in frontiers.values():
                await frontier.open()
        hub: Hub | None = None
        jobs = None
        try:
            hub = Hub.from_config(config, queues=queues, state=state, frontiers=frontiers)
            if config.jobs:
                from crawlhub.collect.service import CollectJobManager

                jobs = CollectJobManager(config)
            plane = await ControlPlane.open(config, collect=jobs) if control else None
        except BaseException:
            if hub is not None:
                await hub.stop()
            await state.close()
            await queues.close()
            raise
        services = cls(config, queues=queues, state=state, hub=hub, frontiers=frontiers,
                       jobs=jobs, control=plane)
        try:
            await services._open_series()
        except BaseException:
            await services.close()
            raise
        return services

    async def _open_series(self) -> None:
        """The charts' store, on the control plane's database."""
        if self.control is None:
            return
        from crawlhub.control.series import SeriesStore

        self.series = SeriesStore(self.control.db)
        await self.series.open()

    def _start_sampler(self) -> None:
        """Sample the outbounds, agents, frontiers and runs into :attr:`series`."""
        if self.series is None or self.control is None:
            return
        from crawlhub.control import sampler

        registries = [self.agents, *[r for r in (self.center_registry,) if r is not None]]
        self._sampler = sampler.Sampler(self.series, {
            "outbounds": sampler.outbound_source(self.hub.outbound_stats),
            "agents": sampler.agent_source(registries),
            "frontiers": sampler.frontier_source(self.frontiers),
            "runs": sampler.run_source(self.control.jobs.store),
        })
        self._sampler.start()

    @property
    def sampler(self) -> Sampler | None:
        """The running sampler (None until :meth:`start`)."""
        return self._sampler

    # ------------------------------------------------------------------ views
    async def outbounds(self, prefix: str = "") -> list[dict[str, Any]]:
        """Every outbound whose name starts with ``prefix``: its counters, queue length
        and rate (:meth:`Hub.outbound_stats`) and its config, secrets masked.
        :class:`NotFoundError` when a ``prefix`` matches none."""
        configs = {ob.name: ob for ob in self.config.outbound}
        rows = await self.hub.outbound_stats(prefix)
        if prefix and not rows:
            raise NotFoundError(f"no outbound name starts with {prefix!r}")
        for row in rows:
            cfg = configs[row["name"]]
            row["config"] = redact(cfg.model_dump(mode="json", by_alias=True,
                                                  exclude={"source_file", "source_index"}))
        return rows

    def frontier(self, name: str) -> Frontier:
        """The frontier ``name``; :class:`NotFoundError` naming the known ones."""
        frontier = self.frontiers.get(name)
        if frontier is None:
            known = ", ".join(sorted(self.frontiers)) or ("none is configured (add a"
                                                          " 'frontier:' section)")
            raise NotFoundError(f"no frontier named {name!r}; known: {known}")
        return frontier

    # ------------------------------------------------------------------ center
    @property
    def center_bus(self) -> Bus | None:
        """The download center's bus on ``center.url`` (None when unset)."""
        url = self.config.center.url
        if url and self._center_bus is None:
            from crawlhub.center import open_bus
            from crawlhub.core.signing import signer_from_config

            self._center_bus = open_bus(url, prefix=self.config.storage.redis_prefix,
                                        signer=signer_from_config(self.config))
        return self._center_bus

    @property
    def center_registry(self) -> AgentRegistry | None:
        """The registry of the center's agents, when it is not ``agents`` already (the
        center on another server than ``storage.agents``); else None."""
        url = self.config.center.url
        if not url or url == self.config.storage.agents_url:
            return None
        if self._center_registry is None:
            from crawlhub.center.center import open_center_registry

            self._center_registry = open_center_registry(self.config, url)
        return self._center_registry

    async def start(self) -> None:
        """Start inbound consumers, the lost-task sweeper, auto-start jobs and, with
        ``center.url`` and ``center.serve``, a download center."""
        if self._started:
            return
        self._started = True
        await self.hub.start()
        if self.jobs is not None:
            await self.jobs.start_auto()
        if self.control is not None:
            await self.control.start()
            # agent dead / queue not draining alerts: the registry and the outbounds' figures
            more = [r for r in (self.center_registry,) if r is not None]
            self.control.alerts.start_watch(self.agents, self.hub.outbound_stats,
                                            more_agents=more)
            self._start_sampler()
        section = self.config.center
        bus = self.center_bus
        if bus is not None and section.serve:
            from crawlhub.center import DownloadCenter

            center = DownloadCenter(bus,
                                    registry=self.center_registry or self.agents,
                                    sync_interval=section.sync_interval,
                                    dead_after=section.dead_after,
                                    claim_after=section.claim_after,
                                    max_skew=section.max_skew)
            self._center_stop = asyncio.Event()
            self._center_task = asyncio.create_task(center.run(self._center_stop))

    async def close(self) -> None:
        if self._sampler is not None:
            await self._sampler.close()
            self._sampler = None
        if self._center_task is not None:
            if self._center_stop is not None:
                self._center_stop.set()
            with contextlib.suppress(Exception):
                await self._center_task
            self._center_task = None
        for held in (self._center_bus, self._center_registry):
            if held is not None:
                with contextlib.suppress(Exception):
                    await held.close()
        self._center_bus = self._center_registry = None
        if self.control is not None:
            with contextlib.suppress(Exception):
                await self.control.close()
        if self.jobs is not None:
            with contextlib.suppress(Exception):
                await self.jobs.close()
        await self.hub.stop()
        for frontier in self.frontiers.values():
            with contextlib.suppress(Exception):
                await frontier.close()
        with contextlib.suppress(Exception):
            await self.agents.close()
        await self.state.close()
        await self.queues.close()
        self._started = False

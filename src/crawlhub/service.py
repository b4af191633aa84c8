"""The running product: every service built from one config, started and stopped together.

``crawlhub serve``, the API app and the tests all build a :class:`Services`; the API and
CLI are thin shells over it.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from crawlhub.agents.registry import AgentRegistry, open_registry
from crawlhub.hub.hub import Hub
from crawlhub.hub.state import HubState, open_state
from crawlhub.queues import open_backend
from crawlhub.queues.base import QueueBackend

log = logging.getLogger("crawlhub.service")


class Services:
    """Queues, hub state, hub, frontiers, jobs and the agent registry of one crawlhub
    process (the registry on ``storage.agents``, by default the hub state's backend)."""

    def __init__(self, config: Any, *, queues: QueueBackend, state: HubState, hub: Hub,
                 frontiers: dict[str, Any], jobs: Any | None = None,
                 agents: AgentRegistry | None = None) -> None:
        self.config = config
        self.queues = queues
        self.state = state
        self.agents = agents or open_registry(config.storage.agents_url,
                                              prefix=config.storage.redis_prefix)
        self.hub = hub
        self.frontiers = frontiers
        self.jobs = jobs
        self._started = False

    @classmethod
    async def open(cls, config: Any) -> Services:
        """Open every backend named by ``config.storage`` and compile the hub."""
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        storage = config.storage
        queues = open_backend(storage.queues, prefix=storage.redis_prefix)
        state = open_state(storage.state, prefix=storage.redis_prefix)
        frontiers: dict[str, Any] = {}
        if config.frontier:
            from crawlhub.frontier import open_frontiers

            frontiers = open_frontiers(config)
            for frontier in frontiers.values():
                await frontier.open()
        try:
            hub = Hub.from_config(config, queues=queues, state=state, frontiers=frontiers)
        except BaseException:
            await state.close()
            await queues.close()
            raise
        jobs = None
        if config.jobs:
            from crawlhub.collect.service import JobManager

            jobs = JobManager(config)
        return cls(config, queues=queues, state=state, hub=hub, frontiers=frontiers, jobs=jobs)

    async def start(self) -> None:
        """Start inbound consumers, the lost-task sweeper and auto-start jobs."""
        if self._started:
            return
        self._started = True
        await self.hub.start()
        if self.jobs is not None:
            await self.jobs.start_auto()

    async def close(self) -> None:
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

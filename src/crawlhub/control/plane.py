"""The control plane of one crawlhub process: every part opened from the ``control``
config section, started and stopped together (``Services.control``).

    plane = await ControlPlane.open(config)
    await plane.start()        # the cron scheduler, the log collector, alert watchers
    ...
    await plane.close()

Parts (each its own module, each usable alone in tests):

- ``db``       :class:`crawlhub.control.db.ControlDB` on ``control.url``
- ``secrets``  :class:`crawlhub.control.secrets.SecretBox` (``control.secret_key``)
- ``logs``     the searchable log store (``crawlhub.control.logs``)
- ``channel``  pause / continue / exit per job (``crawlhub.control.channel``)
- ``projects`` projects and their builds (``crawlhub.control.projects``,
  ``crawlhub.control.builds``)
- ``jobs``     every kind of job, cron, the runner and run history
  (``crawlhub.control.jobs``)
- ``alerts``   per-job alert routes (``crawlhub.control.alerts``)
- ``scrapyd``  Scrapyd's model over the builds and jobs, when ``scrapyd.enabled``
  (``crawlhub.control.scrapyd``); None otherwise
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crawlhub.control.db import ControlDB
from crawlhub.control.secrets import SecretBox

if TYPE_CHECKING:
    from crawlhub.collect.service import CollectJobManager
    from crawlhub.config.schema import CrawlhubConfig
    from crawlhub.control.scrapyd import ScrapydService

log = logging.getLogger("crawlhub.control")


class ControlPlane:
    """The parts of the control plane; see the module docstring."""

    def __init__(self, config: CrawlhubConfig, *, db: ControlDB, secrets: SecretBox,
                 collect: CollectJobManager | None = None) -> None:
        self.config = config
        #: the config's collection jobs (crawlhub.collect.service.CollectJobManager)
        self.collect = collect
        self.db = db
        self.secrets = secrets
        self._closers: list[Any] = []
        self._started = False
        #: Scrapyd's API's service (crawlhub.control.scrapyd), when ``scrapyd.enabled``
        self.scrapyd: ScrapydService | None = None

    @classmethod
    async def open(cls, config: CrawlhubConfig, *, prefix: str = "crawlhub_",
                   collect: CollectJobManager | None = None) -> ControlPlane:
        section = config.control
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        secrets = SecretBox.from_config(config)
        db = await ControlDB.open(section.url, prefix=prefix)
        plane = cls(config, db=db, secrets=secrets, collect=collect)
        try:
            await plane._open_parts(prefix)
        except BaseException:
            await plane.close()
            raise
        return plane

    async def _open_parts(self, prefix: str) -> None:
        """Open each part in dependency order: the jobs last, they use the others."""
        from crawlhub.control.alerts import AlertService, AlertSettings
        from crawlhub.control.builds import BuildService
        from crawlhub.control.channel import open_channel
        from crawlhub.control.logs import LogService

        section = self.config.control
        self.logs = await LogService.open(self.config, prefix=prefix)
        self._closers.append(self.logs.close)
        self.channel = await open_channel(self.config, self.db)
        self._closers.append(self.channel.close)
        self.alerts = await AlertService.open(self.db, self.secrets,
                                              AlertSettings.from_section(section))
        self._closers.append(self.alerts.close)
        self.builds = await BuildService.open_section(self.db, self.secrets, section)
        self.projects = self.builds.projects
        self._closers.append(self.builds.close)
        await self._open_jobs()
        if self.config.scrapyd.enabled:
            from crawlhub.control.scrapyd import ScrapydService

            self.scrapyd = await ScrapydService.open(self.db, self.builds, self.jobs,
                                                     self.logs, self.config.scrapyd)
            self._closers.append(self.scrapyd.close)

    async def _open_jobs(self) -> None:
        """The jobs part: store, runner (logs to the log store, artifacts from the builds,
        alerts at a run's end) and cron; opened after the parts it uses."""
        from crawlhub.control.jobs import JobService, JobStore, Runner
        from crawlhub.control.jobs.container import ContainerRuntime

        section = self.config.control
        containers = ContainerRuntime(section.engine, default_image=section.container_image,
                                      user=section.container_user,
                                      env_dir=Path(section.runs_dir).absolute())
        runner = Runner(JobStore(self.db), channel=self.channel, runs_dir=section.runs_dir,
                        runtime=section.runtime, runtimes={"container": containers},
                        grace=section.grace, log_sink=self.logs.write,
                        log_dropped=self.logs.dropped_of, log_flush=self.logs.flush,
                        artifacts=self.builds.artifact,
                        on_finish=self.alerts.run_finished, collect=self.collect)
        self.jobs = JobService(runner.store, runner, collect=self.collect,
                               allowed_env=section.allowed_env)
        await self.jobs.open()
        self._closers.append(self.jobs.close)

    async def start(self) -> None:
        """Start the background work of the parts (this process's scheduler, ...)."""
        if self._started:
            return
        self._started = True
        await self.logs.start()  # flush task, collector (Redis), pruner, crawlhub.* handler
        if self.config.control.scheduler:
            self.jobs.start_scheduler()
            if self.scrapyd is not None:
                self.scrapyd.start()

    async def close(self) -> None:
        """Stop and close every part, newest first; then the database."""
        for closer in reversed(self._closers):
            with contextlib.suppress(Exception):
                await closer()
        self._closers.clear()
        self._started = False
        await self.db.close()


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
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crawlhub.control.db import ControlDB
from crawlhub.control.secrets import KEY_ENV, SecretBox

if TYPE_CHECKING:
    from crawlhub.config.schema import CrawlhubConfig

log = logging.getLogger("crawlhub.control")


class ControlPlane:
    """The parts of the control plane; see the module docstring."""

    def __init__(self, config: CrawlhubConfig, *, db: ControlDB, secrets: SecretBox) -> None:
        self.config = config
        self.db = db
        self.secrets = secrets
        self._closers: list[Any] = []
        self._started = False

    @classmethod
    async def open(cls, config: CrawlhubConfig, *, prefix: str = "crawlhub_") -> ControlPlane:
        section = config.control
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        key = (section.secret_key.get_secret_value() if section.secret_key
               else os.environ.get(KEY_ENV))
        secrets = SecretBox.from_setting(key, Path(config.data_dir))
        db = await ControlDB.open(section.url, prefix=prefix)
        plane = cls(config, db=db, secrets=secrets)
        try:
            await plane._open_parts(prefix)
        except BaseException:
            await plane.close()
            raise
        return plane

    async def _open_parts(self, prefix: str) -> None:
        """Open each part in dependency order (logs and channel first: jobs use both)."""
        # -- parts: each adds itself here -----------------------------------------------

    async def start(self) -> None:
        """Start the background work of the parts (this process's scheduler, ...)."""
        if self._started:
            return
        self._started = True
        # -- starts: each part that runs in the background adds itself here -------------

    async def close(self) -> None:
        """Stop and close every part, newest first; then the database."""
        for closer in reversed(self._closers):
            with contextlib.suppress(Exception):
                await closer()
        self._closers.clear()
        self._started = False
        await self.db.close()

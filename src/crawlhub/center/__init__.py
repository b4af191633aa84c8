"""The download center (seed 001): jobs keep their parsing and scheduling and send their
downloads here; the center hands them to agents by the job's allocation strategy.

:mod:`.bus` (channels on Redis Streams or in process), :mod:`.messages` (channel names,
message kinds, :class:`Reply`), :mod:`.center` (:class:`DownloadCenter`), :mod:`.worker`
(:class:`CenterWorker`, the agent's side), :mod:`.client` (:class:`CenterClient`, the
job's side).
"""

from crawlhub.center.bus import Bus, BusError, MemoryBus, open_bus
from crawlhub.center.center import DownloadCenter, center_jobs
from crawlhub.center.client import CenterClient
from crawlhub.center.messages import STRATEGIES, CenterError, Reply
from crawlhub.center.worker import CenterWorker

__all__ = [
    "STRATEGIES",
    "Bus",
    "BusError",
    "CenterClient",
    "CenterError",
    "CenterWorker",
    "DownloadCenter",
    "MemoryBus",
    "Reply",
    "center_jobs",
    "open_bus",
]

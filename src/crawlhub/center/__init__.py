"""The download center (seed 001): jobs keep their parsing and scheduling and send their
downloads here; the center hands them to agents by the job's allocation strategy.

:mod:`.bus` (channels on Redis Streams or in process), :mod:`.messages` (channel names,
message kinds, :class:`Reply`), :mod:`.center` (:class:`DownloadCenter`), :mod:`.worker`
(:class:`CenterWorker`, the agent's side), :mod:`.client` (:class:`CenterClient`, the
job's side).
"""

from typing import TYPE_CHECKING

from crawlhub.core.lazy import lazy_face

if TYPE_CHECKING:  # the names below, imported on first use (start-up: crawlhub.core.lazy)
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

__getattr__, __dir__ = lazy_face(__name__, {
    "Bus": "crawlhub.center.bus",
    "BusError": "crawlhub.center.bus",
    "MemoryBus": "crawlhub.center.bus",
    "open_bus": "crawlhub.center.bus",
    "DownloadCenter": "crawlhub.center.center",
    "center_jobs": "crawlhub.center.center",
    "CenterClient": "crawlhub.center.client",
    "STRATEGIES": "crawlhub.center.messages",
    "CenterError": "crawlhub.center.messages",
    "Reply": "crawlhub.center.messages",
    "CenterWorker": "crawlhub.center.worker",
})

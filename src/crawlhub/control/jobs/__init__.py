"""Jobs of every kind, cron, the runner and run history (issue 10, seed 001).

``model``: JobSpec, RunRecord, TaskRecord; ``store``: their tables; ``runner``: runs a
job and follows it; ``runtime``: where it runs (a process; ``container``: podman); ``cron``: fires ticks; ``service``: JobService, what the API calls.
"""

from crawlhub.control.jobs.model import JobPatch, JobSpec, RunRecord, TaskRecord
from crawlhub.control.jobs.runner import Runner
from crawlhub.control.jobs.service import JobService, JobView, QueueInfo, RunView
from crawlhub.control.jobs.store import JobStore

__all__ = ["JobPatch", "JobService", "JobSpec", "JobStore", "JobView",
           "QueueInfo", "RunRecord", "RunView", "Runner", "TaskRecord"]

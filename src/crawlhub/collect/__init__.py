"""collect: API collection jobs (newest-first incremental, time windows, full scans).

The public face; behind it: plan (pure planners), source (requests and answers), store
(progress, cursors, runs), runner (one run), build (a run from config), service
(CollectJobManager).

"Job" here is a collection job of the config's ``jobs:`` (``crawlhub collect``), one of
the kinds of job the control plane runs (``crawlhub.control``).
"""

from crawlhub.collect.build import new_run
from crawlhub.collect.plan import IncrementalState, Sweep, plan_incremental
from crawlhub.collect.runner import JobRun
from crawlhub.collect.service import CollectJobManager, JobConflict, JobNotFound
from crawlhub.collect.store import JobRunRecord, MetadataStore, Progress, open_metadata_store

__all__ = [
    "CollectJobManager",
    "IncrementalState",
    "JobConflict",
    "JobNotFound",
    "JobRun",
    "JobRunRecord",
    "MetadataStore",
    "Progress",
    "Sweep",
    "new_run",
    "open_metadata_store",
    "plan_incremental",
]

"""collect: API collection jobs (newest-first incremental, time windows, full scans).

The public face; behind it: plan (pure planners), source (requests and answers), store
(progress, cursors, runs), runner (one run), build (a run from config), service
(CollectJobManager).

"Job" here is a collection job of the config's ``jobs:`` (``crawlhub collect``), one of
the kinds of job the control plane runs (``crawlhub.control``).
"""

from typing import TYPE_CHECKING

from crawlhub.core.lazy import lazy_face

if TYPE_CHECKING:  # the names below, imported on first use (start-up: crawlhub.core.lazy)
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

__getattr__, __dir__ = lazy_face(__name__, {
    "new_run": "crawlhub.collect.build",
    "IncrementalState": "crawlhub.collect.plan",
    "Sweep": "crawlhub.collect.plan",
    "plan_incremental": "crawlhub.collect.plan",
    "JobRun": "crawlhub.collect.runner",
    "CollectJobManager": "crawlhub.collect.service",
    "JobConflict": "crawlhub.collect.service",
    "JobNotFound": "crawlhub.collect.service",
    "JobRunRecord": "crawlhub.collect.store",
    "MetadataStore": "crawlhub.collect.store",
    "Progress": "crawlhub.collect.store",
    "open_metadata_store": "crawlhub.collect.store",
})

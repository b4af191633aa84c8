"""pipeline: processing pool, single batching writer, run result, progress, job logs.

The public face; behind it: run (Pipeline, DetailMode), pool, writer, result, progress,
and the config model from ``crawlhub.pipeline.config``.
"""

from typing import TYPE_CHECKING

from crawlhub.core.lazy import lazy_face

if TYPE_CHECKING:  # the names below, imported on first use (start-up: crawlhub.core.lazy)
    from crawlhub.fetch.joblog import JobLog, JobLogs, job_log, job_logs
    from crawlhub.pipeline.config import (
        CLI_FLAGS,
        PIPELINE_KEYS,
        PipelineConfig,
        PipelineConfigError,
        PipelineSection,
        cli_overrides,
        resolve_pipeline_config,
    )
    from crawlhub.pipeline.pool import Process, ProcessingPool
    from crawlhub.pipeline.progress import ProgressBars, describe_progress, show_progress
    from crawlhub.pipeline.result import RunResult, Status
    from crawlhub.pipeline.run import AtomicBatch, DetailMode, Pipeline
    from crawlhub.pipeline.writer import BatchWriter

__all__ = [
    "CLI_FLAGS",
    "PIPELINE_KEYS",
    "AtomicBatch",
    "BatchWriter",
    "DetailMode",
    "JobLog",
    "JobLogs",
    "Pipeline",
    "PipelineConfig",
    "PipelineConfigError",
    "PipelineSection",
    "Process",
    "ProcessingPool",
    "ProgressBars",
    "RunResult",
    "Status",
    "cli_overrides",
    "describe_progress",
    "job_log",
    "job_logs",
    "resolve_pipeline_config",
    "show_progress",
]

__getattr__, __dir__ = lazy_face(__name__, {
    "JobLog": "crawlhub.fetch.joblog",
    "JobLogs": "crawlhub.fetch.joblog",
    "job_log": "crawlhub.fetch.joblog",
    "job_logs": "crawlhub.fetch.joblog",
    "CLI_FLAGS": "crawlhub.pipeline.config",
    "PIPELINE_KEYS": "crawlhub.pipeline.config",
    "PipelineConfig": "crawlhub.pipeline.config",
    "PipelineConfigError": "crawlhub.pipeline.config",
    "PipelineSection": "crawlhub.pipeline.config",
    "cli_overrides": "crawlhub.pipeline.config",
    "resolve_pipeline_config": "crawlhub.pipeline.config",
    "Process": "crawlhub.pipeline.pool",
    "ProcessingPool": "crawlhub.pipeline.pool",
    "ProgressBars": "crawlhub.pipeline.progress",
    "describe_progress": "crawlhub.pipeline.progress",
    "show_progress": "crawlhub.pipeline.progress",
    "RunResult": "crawlhub.pipeline.result",
    "Status": "crawlhub.pipeline.result",
    "AtomicBatch": "crawlhub.pipeline.run",
    "DetailMode": "crawlhub.pipeline.run",
    "Pipeline": "crawlhub.pipeline.run",
    "BatchWriter": "crawlhub.pipeline.writer",
})

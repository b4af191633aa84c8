"""pipeline: processing pool, single batching writer, run result, progress, job logs.

The public face; behind it: run (Pipeline, DetailMode), pool, writer, result, progress,
and the config model from ``crawlhub.pipeline.config``.
"""

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

"""fetch: rate-limited request scheduling, cancellation, retries and the HTTP clients.

The public face; the modules behind it hold one concept each (cancel, timer, http,
scheduler, retry, fetcher, joblog).
"""

from crawlhub.core.errors import CancelledError, FetchError
from crawlhub.fetch.cancel import CancellationToken, ctrl_c_cancels
from crawlhub.fetch.fetcher import Fetcher, FetchStats
from crawlhub.fetch.http import (
    CurlCffiClient,
    HttpClient,
    Request,
    RequestTimeout,
    Response,
    Transport,
    TransportError,
    make_client,
)
from crawlhub.fetch.joblog import JobLog, JobLogs, job_log, job_logs
from crawlhub.fetch.retry import RetryPolicy, TooManyFailures, Verdict
from crawlhub.fetch.scheduler import RequestScheduler, Slot, check_rate
from crawlhub.fetch.timer import ManualTimer, MonotonicTimer, Timer

__all__ = [
    "CancellationToken",
    "CancelledError",
    "Timer",
    "CurlCffiClient",
    "FetchError",
    "FetchStats",
    "Fetcher",
    "HttpClient",
    "JobLog",
    "JobLogs",
    "ManualTimer",
    "MonotonicTimer",
    "Request",
    "RequestScheduler",
    "RequestTimeout",
    "Response",
    "RetryPolicy",
    "Slot",
    "TooManyFailures",
    "Transport",
    "TransportError",
    "Verdict",
    "check_rate",
    "ctrl_c_cancels",
    "job_log",
    "job_logs",
    "make_client",
]

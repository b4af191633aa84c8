"""fetch: rate-limited request scheduling, cancellation, retries and the HTTP clients.

The public face; the modules behind it hold one concept each (cancel, timer, http,
scheduler, retry, fetcher, joblog).
"""

from typing import TYPE_CHECKING

from crawlhub.core.lazy import lazy_face

if TYPE_CHECKING:  # the names below, imported on first use (start-up: crawlhub.core.lazy)
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

__getattr__, __dir__ = lazy_face(__name__, {
    "CancelledError": "crawlhub.core.errors",
    "FetchError": "crawlhub.core.errors",
    "CancellationToken": "crawlhub.fetch.cancel",
    "ctrl_c_cancels": "crawlhub.fetch.cancel",
    "Fetcher": "crawlhub.fetch.fetcher",
    "FetchStats": "crawlhub.fetch.fetcher",
    "CurlCffiClient": "crawlhub.fetch.http",
    "HttpClient": "crawlhub.fetch.http",
    "Request": "crawlhub.fetch.http",
    "RequestTimeout": "crawlhub.fetch.http",
    "Response": "crawlhub.fetch.http",
    "Transport": "crawlhub.fetch.http",
    "TransportError": "crawlhub.fetch.http",
    "make_client": "crawlhub.fetch.http",
    "JobLog": "crawlhub.fetch.joblog",
    "JobLogs": "crawlhub.fetch.joblog",
    "job_log": "crawlhub.fetch.joblog",
    "job_logs": "crawlhub.fetch.joblog",
    "RetryPolicy": "crawlhub.fetch.retry",
    "TooManyFailures": "crawlhub.fetch.retry",
    "Verdict": "crawlhub.fetch.retry",
    "RequestScheduler": "crawlhub.fetch.scheduler",
    "Slot": "crawlhub.fetch.scheduler",
    "check_rate": "crawlhub.fetch.scheduler",
    "ManualTimer": "crawlhub.fetch.timer",
    "MonotonicTimer": "crawlhub.fetch.timer",
    "Timer": "crawlhub.fetch.timer",
})

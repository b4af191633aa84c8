"""The fetcher: one job's way to send a request through scheduler, retries and its token.

Every attempt is logged (endpoint, status, duration, job code); a request that still fails
after its tries is recorded and raised as ``FetchError``; too many in a row trips the run.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from crawlhub.core.errors import CancelledError, FetchError
from crawlhub.fetch.cancel import CancellationToken
from crawlhub.fetch.http import Request, RequestTimeout, Response, Transport
from crawlhub.fetch.joblog import JobLog, job_log
from crawlhub.fetch.retry import RetryPolicy, TooManyFailures, Verdict
from crawlhub.fetch.scheduler import RequestScheduler

#: How many error summaries a stage keeps (the counts stay exact).
MAX_ERRORS = 100


@dataclass
class FetchStats:
    """Counters of one stage (``list`` or ``detail``) of one job's requests."""

    ok: int = 0  # requests that succeeded (after retries)
    failed: int = 0  # requests that failed after all their tries
    cancelled: int = 0  # requests abandoned because the token was cancelled
    attempts: int = 0  # HTTP attempts sent
    retries: int = 0  # attempts beyond the first
    request_time: float = 0.0  # seconds spent in attempts (waiting for responses)
    wait_time: float = 0.0  # seconds spent waiting for a turn (rate limits)
    backoff_time: float = 0.0  # seconds spent backing off between tries
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.ok + self.failed

    def record_error(self, **summary: Any) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(summary)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Fetcher:
    """Sends one job's requests: ``await fetcher.fetch(Request(url))``.

    - waits for a turn from ``scheduler`` (interruptible by ``token``),
    - sends with ``client`` (the response wait is interruptible by ``token`` too),
    - judges the response with ``retry``; retryable errors back off and try again,
    - after the last try records the error and raises ``FetchError``;
    - more than ``max_consecutive_failures`` failed requests in a row raise (and keep
      raising) ``TooManyFailures``; a success resets the count.

    A cancelled token raises ``crawlhub.core.errors.CancelledError`` and sends nothing more.
    ``hold`` (settable), when given, is awaited before each request's first attempt: a
    paused run holds new requests there while the ones in flight finish.
    """

    def __init__(
        self,
        client: Transport,
        scheduler: RequestScheduler,
        retry: RetryPolicy | None = None,
        *,
        job_code: str,
        token: CancellationToken | None = None,
        logger: JobLog | None = None,
        max_consecutive_failures: int = 10,
        timeout: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if max_consecutive_failures < 1:
            raise ValueError(
                f"max_consecutive_failures must be >= 1, got {max_consecutive_failures!r}"
            )
        self.client = client
        self.scheduler = scheduler
        self.retry = retry or RetryPolicy()
        self.job_code = job_code
        self.token = token or CancellationToken()
        self.log = logger or job_log(job_code)
        self.max_consecutive_failures = max_consecutive_failures
        self.timeout = timeout
        self.rng = rng or scheduler.rng
        self.stats: dict[str, FetchStats] = {"list": FetchStats(), "detail": FetchStats()}
        self.consecutive_failures = 0
        self.tripped: TooManyFailures | None = None
        self.hold: Callable[[], Awaitable[None]] | None = None
        scheduler.register(job_code)

    def stage(self, name: str) -> FetchStats:
        stats = self.stats.get(name)
        if stats is None:
            stats = self.stats[name] = FetchStats()
        return stats

    async def fetch(self, req: Request, *, stage: str = "list") -> Response:
        """The response to ``req`` once it succeeded; ``FetchError`` after its tries."""
        stats = self.stage(stage)
        self.token.raise_if_cancelled()
        if self.hold is not None:
            await self.hold()
        if self.tripped is not None:
            raise self.tripped
        verdict: Verdict | None = None
        clock = self.scheduler.clock
        for attempt in range(1, self.retry.tries + 1):
            if attempt > 1:
                delay = self.retry.backoff(attempt - 1, self.rng)
                self.log.info("retry backoff", endpoint=req.endpoint, attempt=attempt,
                              delay=round(delay, 3))
                began = clock.now()
                try:
                    await clock.sleep(delay, self.token)
                finally:
                    stats.backoff_time += clock.now() - began
                stats.retries += 1
            try:
                response, verdict = await self._attempt(req, attempt, stats)
            except CancelledError:
                stats.cancelled += 1
                self.log.warning("request abandoned", endpoint=req.endpoint, url=req.url,
                                 reason=self.token.reason)
                raise
            if verdict is None:
                assert response is not None
                stats.ok += 1
                self.consecutive_failures = 0
                return response
            if not verdict.retryable:
                break
        assert verdict is not None
        self._give_up(req, verdict, stats, attempt)

    async def _attempt(
        self, req: Request, attempt: int, stats: FetchStats
    ) -> tuple[Response | None, Verdict | None]:
        clock = self.scheduler.clock
        async with self.scheduler.slot(req, job_code=self.job_code, token=self.token) as slot:
            stats.wait_time += slot.waited
            stats.attempts += 1
            began = clock.now()
            try:
                response = await self.token.run(self.client.request(req, self.timeout))
            except CancelledError:
                raise
            except FetchError as exc:
                duration = clock.now() - began
                stats.request_time += duration
                status = "timeout" if isinstance(exc, RequestTimeout) else "error"
                self.log.warning("request", endpoint=req.endpoint, url=req.url, status=status,
                                 duration=round(duration, 4), attempt=attempt, error=str(exc))
                return None, Verdict(str(exc), True)
            duration = clock.now() - began
            stats.request_time += duration
        verdict = self.retry.judge(response)
        fields: dict[str, Any] = {"endpoint": req.endpoint, "url": req.url,
                                  "status": response.status, "duration": round(duration, 4),
                                  "attempt": attempt}
        if verdict is None:
            self.log.info("request", **fields)
        else:
            self.log.warning("request", **fields, error=verdict.error)
        return response, verdict

    def _give_up(self, req: Request, verdict: Verdict, stats: FetchStats, tries: int) -> NoReturn:
        stats.failed += 1
        self.consecutive_failures += 1
        stats.record_error(endpoint=req.endpoint, url=req.url, error=verdict.error, tries=tries,
                           meta=dict(req.meta))
        self.log.error("request failed", endpoint=req.endpoint, url=req.url, tries=tries,
                       error=verdict.error, consecutive=self.consecutive_failures)
        if self.consecutive_failures > self.max_consecutive_failures:
            self.tripped = TooManyFailures(
                f"job {self.job_code}: {self.consecutive_failures} requests failed in a row "
                f"(more than max_consecutive_failures={self.max_consecutive_failures}); "
                f"last: {req.endpoint}: {verdict.error}",
                consecutive=self.consecutive_failures,
            )
            self.log.error("too many consecutive failures", consecutive=self.consecutive_failures,
                           limit=self.max_consecutive_failures)
            raise self.tripped
        raise FetchError(
            f"job {self.job_code}: {req.endpoint} ({req.url}) failed after {tries} "
            f"{'try' if tries == 1 else 'tries'}: {verdict.error}"
        )

    def totals(self) -> dict[str, Any]:
        return {name: stats.to_dict() for name, stats in self.stats.items()}

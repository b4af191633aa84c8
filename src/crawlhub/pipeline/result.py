"""The result of one pipeline run: status, counts per stage, time per stage, error summaries.

The same object is live while the run goes (progress reads it) and final after ``finish``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: How many error summaries a stage keeps (the counts stay exact).
MAX_ERRORS_PER_STAGE = 100


class Status(StrEnum):
    """How a run ended."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"


@dataclass
class RunResult:
    """Counts of a run. Requests count after retries; records count what went through.

    - ``requests_ok/failed``: list-stage requests; ``detail_ok/failed/skipped``: detail ids
      (skipped = empty or repeated ids, and ids not reached after a cancel or failure when
      nobody keeps them); ``detail_pending``: ids kept for the next run (not reached after
      a stop, or their batch was not written);
    - ``records_processed``: records the processing pool produced; ``records_failed``:
      items whose processing raised (or produced a non-dict record);
    - ``records_written``: inserted + updated by the sink; ``records_skipped``: unchanged
      rows the sink skipped; ``records_write_failed``: records of failed (rolled back)
      batches plus rows a sink reported failed;
    - ``timings``: seconds per stage (``total``, ``list``, ``detail``, ``request``,
      ``rate_wait``, ``backoff``, ``process``, ``write``, ``backpressure``);
    - ``errors``: per stage (``request``, ``detail``, ``process``, ``write``), up to 100
      summaries each.
    """

    job_code: str
    status: Status = Status.RUNNING
    reason: str | None = None
    requests_ok: int = 0
    requests_failed: int = 0
    requests_retried: int = 0
    records_processed: int = 0
    records_failed: int = 0
    records_written: int = 0
    records_skipped: int = 0
    records_write_failed: int = 0
    batches_written: int = 0
    batches_failed: int = 0
    detail_ok: int = 0
    detail_failed: int = 0
    detail_skipped: int = 0
    detail_pending: int = 0
    backpressure_waits: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    errors: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {"request": [], "detail": [], "process": [], "write": []}
    )

    def add_error(self, stage: str, **summary: Any) -> None:
        bucket = self.errors.setdefault(stage, [])
        if len(bucket) < MAX_ERRORS_PER_STAGE:
            bucket.append(summary)

    def add_time(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    @property
    def finished(self) -> bool:
        return self.status is not Status.RUNNING

    def error_counts(self) -> dict[str, dict[str, int]]:
        """Per stage, how often each error text occurred (among the kept summaries)."""
        return {
            stage: dict(Counter(str(e.get("error", "?")) for e in items))
            for stage, items in self.errors.items()
            if items
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_code": self.job_code,
            "status": self.status.value,
            "reason": self.reason,
            "requests": {"ok": self.requests_ok, "failed": self.requests_failed,
                         "retried": self.requests_retried},
            "records": {
                "processed": self.records_processed,
                "failed": self.records_failed,
                "written": self.records_written,
                "skipped": self.records_skipped,
                "write_failed": self.records_write_failed,
            },
            "batches": {"written": self.batches_written, "failed": self.batches_failed},
            "detail": {"ok": self.detail_ok, "failed": self.detail_failed,
                       "skipped": self.detail_skipped, "pending": self.detail_pending},
            "backpressure_waits": self.backpressure_waits,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "timings": {k: round(v, 6) for k, v in self.timings.items()},
            "errors": {k: list(v) for k, v in self.errors.items()},
            "error_counts": self.error_counts(),
        }

    def summary(self) -> str:
        """One line for logs and the CLI."""
        text = (
            f"{self.job_code}: {self.status.value}; requests {self.requests_ok} ok / "
            f"{self.requests_failed} failed; records {self.records_processed} processed / "
            f"{self.records_failed} failed, {self.records_written} written / "
            f"{self.records_write_failed} failed / {self.records_skipped} unchanged"
        )
        if self.detail_ok or self.detail_failed or self.detail_skipped or self.detail_pending:
            text += (f"; detail {self.detail_ok} ok / {self.detail_failed} failed / "
                     f"{self.detail_skipped} skipped")
            if self.detail_pending:
                text += f" / {self.detail_pending} pending"
        if "total" in self.timings:
            text += f"; {self.timings['total']:.2f}s"
        if self.reason:
            text += f" ({self.reason})"
        return text

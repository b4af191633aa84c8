"""Prometheus metrics of the hub, on a registry of its own (one per hub instance)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge


class HubMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.dispatched = Counter("crawlhub_tasks_dispatched", "Tasks pushed to an outbound",
                                  ["outbound"], registry=r)
        self.rejected = Counter("crawlhub_tasks_rejected", "Tasks no outbound took",
                                registry=r)
        self.duplicates = Counter("crawlhub_tasks_duplicate",
                                  "Tasks a frontier had already admitted in their segment",
                                  ["frontier"], registry=r)
        self.backpressure = Counter("crawlhub_backpressure",
                                    "Intake refused or paused by max_lag", ["outbound"],
                                    registry=r)
        self.results = Counter("crawlhub_results", "Results handled, by outcome",
                               ["outbound", "outcome"], registry=r)
        self.lag = Gauge("crawlhub_outbound_lag", "Tasks waiting in an outbound",
                         ["outbound"], registry=r)
        self.http_requests = Counter("crawlhub_http_requests", "API requests",
                                     ["method", "route", "status"], registry=r)
        self._dispatched_to: dict[str, Any] = {}

    def dispatched_to(self, outbound: str) -> Any:
        """The ``dispatched`` counter of ``outbound``: labels() looked up once per
        outbound (it takes a lock and builds a key each call; intake counts per push)."""
        child = self._dispatched_to.get(outbound)
        if child is None:
            child = self._dispatched_to[outbound] = self.dispatched.labels(outbound)
        return child

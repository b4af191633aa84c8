"""crawlhub: a control plane for data collection.

Tasks come in, are deduplicated, routed by rules to reliable queues, fetched under rate
limits, processed and written to stores; failures are retried or re-routed.
"""

__version__ = "0.1.0"

"""The ``center`` config section: where the download center's messages travel and how it
judges agents. ``crawlhub center``, ``crawlhub agent --center``, ``crawlhub crawl
--center``, ``crawlhub serve`` (which runs a center when ``url`` is set and ``serve`` is
on), ``crawlhub agents`` and ``GET /agents/`` / ``GET /center/jobs/`` read it.

    center:
      url: redis://127.0.0.1:6379/0   # the broker (Redis Streams); memory:// in process
      serve: true                     # crawlhub serve runs a center too
      sync_interval: 15               # seconds between two syncs of registry and allocations
      dead_after: 11                  # seconds of silence after which an agent is dead
      claim_after: 5                  # seconds before a dead center's messages are served
      idle_release: 300               # seconds before an agent closes an unused job downloader
      beat_every: 3                   # seconds between two heartbeats of an agent
      key: ...                        # HMAC key signing every message (or $CRAWLHUB_CENTER_KEY,
                                      # or <data dir>/center.key); unset: unsigned, with a warning
      max_skew: 300                   # seconds a message's or beat's stamp may be off this clock
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class CenterSection(BaseModel):
    """Config key ``center``."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    serve: bool = True
    sync_interval: float = Field(default=15.0, gt=0)
    dead_after: float = Field(default=11.0, gt=0)
    claim_after: float = Field(default=5.0, gt=0)
    idle_release: float = Field(default=300.0, gt=0)
    beat_every: float = Field(default=3.0, gt=0)
    #: the message signing key shared by every center, agent and job (crawlhub.core.signing)
    key: SecretStr | None = None
    max_skew: float = Field(default=300.0, gt=0)

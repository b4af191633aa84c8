"""The ``scrapyd`` config section: Scrapyd's JSON API served by ``crawlhub serve`` on a
port of its own, off unless enabled (docs/scrapyd.md).

    scrapyd:
      enabled: false                 # serve Scrapyd's API (scrapyd-deploy, ScrapydWeb, ...)
      bind: 127.0.0.1                # its address; another machine's needs server.token
      port: 6800                     # Scrapyd's own default port
      node_name: null                # "node_name" of every answer (default: the host name)
      max_proc: 0                    # spiders running at once (0: CPUs x max_proc_per_cpu)
      max_proc_per_cpu: 4
      finished_to_keep: 100          # finished jobs listjobs.json shows (older are dropped)
      items_dir: "{data_dir}/scrapyd/items"  # each job's items as JSON lines ("": none)
      jobs_to_keep: 5                # item files kept per spider
      max_egg_bytes: 104857600       # the largest egg (request body) taken
      list_timeout: 60               # seconds `scrapy list` may take on an egg
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from crawlhub.core.configtypes import Duration


class ScrapydSection(BaseModel):
    """Config key ``scrapyd``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    bind: str = "127.0.0.1"
    port: int = Field(default=6800, ge=1, le=65535)
    node_name: str | None = Field(default=None, max_length=200)
    max_proc: int = Field(default=0, ge=0, le=10_000)
    max_proc_per_cpu: int = Field(default=4, ge=1, le=1000)
    finished_to_keep: int = Field(default=100, ge=1, le=100_000)
    items_dir: str = "{data_dir}/scrapyd/items"
    jobs_to_keep: int = Field(default=5, ge=1, le=100_000)
    max_egg_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    list_timeout: Duration = Field(default=60.0, gt=0)

    def slots(self, cpus: int | None) -> int:
        """Spiders run at once: ``max_proc``, else CPUs x ``max_proc_per_cpu`` (Scrapyd's
        rule)."""
        return self.max_proc or max(1, cpus or 1) * self.max_proc_per_cpu

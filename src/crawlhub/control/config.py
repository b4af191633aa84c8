"""The ``control`` config section: the control plane's projects, builds, jobs, runs,
logs and alerts (issue 10). ``crawlhub serve`` runs it; ``crawlhub jobs|runs|logs|
projects|builds`` read the same stores.

    control:
      url: sqlite:///{data_dir}/control.db   # projects, builds, jobs, runs, alerts
                                             # (or postgresql://... distributed)
      logs_url: sqlite:///{data_dir}/logs.db # the searchable log store (FTS5 / PG full text)
      channel: null                          # redis://... : pause/continue/exit and log
                                             # transport between hosts; null: in process
      secret_key: null                       # Fernet key(s) for secrets at rest; default:
                                             # $CRAWLHUB_SECRET_KEY or <data_dir>/secret.key
      tag_pattern: release/{{name}}/{{version}}  # the release tag that runs a build (braces
                                             # doubled: {x} is a config placeholder)
      builds_dir: "{data_dir}/builds"        # clones, virtualenvs and artifacts
      runs_dir: "{data_dir}/runs"            # per-run working files (control file, counters)
      scheduler: true                        # this process fires cron ticks and runs jobs
      grace: 10                              # seconds between the graceful signal and kill
      allowed_env: []                        # loader / startup-hook variables (LD_*,
                                             # PYTHONSTARTUP, NODE_OPTIONS, ...) a job's
                                             # env may set all the same (docs/jobs.md)
      log_max_age: 7d                        # log retention by age
      log_max_lines: 5000000                 # ... and by size
      smtp_url: null                         # alert emails: smtp://user:pass@host:587
                                             # (smtps://... for TLS from the start)
      smtp_from: crawlhub@localhost          # their From address
      smtp_starttls: null                    # null: STARTTLS when offered; true: required
      alert_interval: 10m                    # the same alert is not re-sent within this
      alert_timeout: 10                      # seconds per webhook / SMTP attempt
      alert_poll: 15                         # seconds between agent / queue checks
      alert_allowed_hosts: []                # webhook hosts taken ([]: any; else only
                                             # these: hooks.slack.com, *.example.com)
      alert_denied_networks: [169.254.0.0/16, fe80::/10, fd00:ec2::254/128,
                              100.100.100.200/32]  # never reached (link-local, cloud
                                             # metadata); loopback and LANs are allowed
      queue_stall_after: 10m                 # a queue with Left > 0 and no Success for
                                             # this long is stalled
      builder: venv                          # new projects' builder: venv, wheel, docker,
                                             # command (crawlhub.control.builders)
      build_timeout: 15m                     # clone + build, then the build fails
      build_log_lines: 5000                  # the last lines of a build's log kept
      builds_parallel: 2                     # builds run at once by this process
      runtime: process                       # where jobs run unless they say: process
                                             # (a child process) or container
      engine: podman                         # the container engine's CLI (or docker)
      container_image: null                  # image of container jobs that name none
      container_user: "65534:65534"          # the user inside job containers (nobody)
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from crawlhub.core.configtypes import Duration, new_list
from crawlhub.core.redact import redact_url

DEFAULT_TAG_PATTERN = "release/{name}/{version}"
#: What no alert webhook reaches unless ``alert_denied_networks`` says otherwise:
#: link-local (IPv4 and IPv6; the metadata service of AWS, GCP, Azure and OpenStack
#: answers at 169.254.169.254), AWS's IPv6 metadata address and Alibaba Cloud's.
DEFAULT_DENIED_NETWORKS = ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128",
                           "100.100.100.200/32")


class ControlSection(BaseModel):
    """Config key ``control``."""

    model_config = ConfigDict(extra="forbid")

    url: str = "sqlite:///{data_dir}/control.db"
    logs_url: str = "sqlite:///{data_dir}/logs.db"
    channel: str | None = None
    secret_key: SecretStr | None = None
    tag_pattern: str = DEFAULT_TAG_PATTERN
    builds_dir: str = "{data_dir}/builds"
    runs_dir: str = "{data_dir}/runs"
    scheduler: bool = True
    grace: Duration = Field(default=10.0, gt=0)
    allowed_env: list[str] = Field(default_factory=new_list, max_length=100)
    log_max_age: Duration = Field(default=7 * 86400.0, gt=0)
    log_max_lines: int = Field(default=5_000_000, ge=1000)
    # -- alerts (crawlhub.control.alerts) --
    smtp_url: SecretStr | None = None
    smtp_from: str = "crawlhub@localhost"
    smtp_starttls: bool | None = None
    alert_interval: Duration = Field(default=600.0, ge=0)
    alert_timeout: Duration = Field(default=10.0, gt=0)
    alert_poll: Duration = Field(default=15.0, gt=0)
    alert_allowed_hosts: list[str] = Field(default_factory=new_list, max_length=1000)
    alert_denied_networks: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DENIED_NETWORKS), max_length=1000)
    queue_stall_after: Duration = Field(default=600.0, gt=0)
    # -- builds (crawlhub.control.builds) --
    builder: str = "venv"
    build_timeout: Duration = Field(default=900.0, gt=0)
    build_log_lines: int = Field(default=5000, ge=100, le=1_000_000)
    builds_parallel: int = Field(default=2, ge=1, le=64)
    # -- job runtimes (crawlhub.control.jobs.runtime, .container) --
    runtime: Literal["process", "container"] = "process"
    engine: str = Field(default="podman", pattern=r"^[A-Za-z0-9_./-]{1,200}$")
    container_image: str | None = None
    container_user: str = Field(default="65534:65534", pattern=r"^[0-9]{1,10}(:[0-9]{1,10})?$")

    @field_validator("tag_pattern")
    @classmethod
    def _tag_pattern(cls, value: str) -> str:
        from crawlhub.control.hooks import TagPattern

        TagPattern(value)  # a pattern git can never match is an error here, with why
        return value

    @field_validator("allowed_env")
    @classmethod
    def _env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
                raise ValueError(f"{name[:80]!r} is not an environment variable name"
                                 " (letters, digits and '_'); list names such as LD_AUDIT")
        return value

    @field_validator("alert_denied_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        import ipaddress

        for item in value:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{item[:80]!r} is not an IP network: write one like"
                                 " 169.254.0.0/16, fe80::/10 or 10.1.2.3") from None
        return value

    @field_validator("url", "logs_url")
    @classmethod
    def _sql_url(cls, value: str) -> str:
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme not in ("sqlite", "postgres", "postgresql"):
            raise ValueError(f"URL {redact_url(value)!r} must start with sqlite://, postgres:// or"
                             " postgresql://")
        return value

    @field_validator("smtp_url")
    @classmethod
    def _smtp_url(cls, value: SecretStr | None) -> SecretStr | None:
        # the message never shows the URL: it holds the SMTP password
        if value is None:
            return None
        scheme, sep, _ = value.get_secret_value().partition("://")
        if not sep or scheme.lower() not in ("smtp", "smtps"):
            raise ValueError("the SMTP URL must look like smtp://user:password@host:587 (or"
                             " smtps://... for TLS from the first byte)")
        return value

    @field_validator("channel")
    @classmethod
    def _channel_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme not in ("redis", "rediss", "valkey", "memory"):
            raise ValueError(f"channel URL {redact_url(value)!r} must start with redis:// (or be null"
                             " for the in-process channel)")
        return value

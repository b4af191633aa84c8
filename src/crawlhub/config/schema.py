"""Pydantic models of the crawlhub config file: what each section and entry may hold.

The loader reads YAML, merges includes and resolves placeholders, then validates here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from crawlhub.agents.config import AgentSection
from crawlhub.backends.backend import SCHEMES, Kind
from crawlhub.center.config import CenterSection
from crawlhub.collect.config import CollectJobConfig
from crawlhub.config.settings import DEFAULT_DATA_DIR, Settings
from crawlhub.control.config import ControlSection
from crawlhub.control.scrapyd.config import ScrapydSection
from crawlhub.core.configtypes import (
    Duration,
    StrList,
    as_dict,
    new_list,
)
from crawlhub.core.configtypes import Section as _Section
from crawlhub.core.hosts import is_loopback
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.core.redact import SecretNames, redact_url
from crawlhub.frontier.config import FrontierConfig
from crawlhub.hub.config import (
    FailureConfig,
    InboundConfig,
    OutboundConfig,
    RoutingConfig,
)
from crawlhub.pipeline.config import PipelineSection


def _schemes(*kinds: Kind) -> tuple[str, ...]:
    """The schemes storage.urls opens for ``kinds``, driver aliases (``+``) last."""
    return tuple(sorted((s for s, (k, _) in SCHEMES.items() if k in kinds),
                        key=lambda s: "+" in s))


_QUEUE_SCHEMES = _schemes("sqlite", "redis")
_METADATA_SCHEMES = _schemes("sqlite", "postgres")


def _check_scheme(value: str, allowed: tuple[str, ...], what: str) -> str:
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme not in allowed:
        raise ValueError(
            f"{what} URL {redact_url(value)!r} must start with one of "
            + ", ".join(f"{s}://" for s in allowed)
        )
    return value


class StorageConfig(_Section):
    """Backend URLs. The same config scales out by switching sqlite:// to redis:// etc."""

    queues: str = "sqlite:///{data_dir}/queues.db"
    state: str = "sqlite:///{data_dir}/hub.db"
    metadata: str = "sqlite:///{data_dir}/meta.db"
    frontier: str = "sqlite:///{data_dir}/frontier.db"
    #: The agent registry and the domain gate (slots, pace, robots.txt cache) that every
    #: agent and the API share; None: the same backend as ``state``.
    agents: str | None = None
    redis_prefix: str = DEFAULT_PREFIX

    @field_validator("queues", "state", "frontier")
    @classmethod
    def _queue_like(cls, value: str) -> str:
        return _check_scheme(value, _QUEUE_SCHEMES, "storage")

    @field_validator("agents")
    @classmethod
    def _agents_like(cls, value: str | None) -> str | None:
        return None if value is None else _check_scheme(value, _QUEUE_SCHEMES, "storage")

    @property
    def agents_url(self) -> str:
        """Where agents register and share politeness: ``agents``, else ``state``."""
        return self.agents or self.state

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: str) -> str:
        return _check_scheme(value, _METADATA_SCHEMES, "metadata")


#: The shortest ``server.token`` accepted: a token is the only lock on a server that runs
#: commands, and a short one is guessed (even throttled: docs/security.md).
MIN_TOKEN_LENGTH = 16
#: What a user types to get a good token (said in the errors that ask for one).
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class ServerConfig(_Section):
    bind: str = "127.0.0.1"
    port: int = Field(default=8526, ge=1, le=65535)
    token: SecretStr | None = None
    #: Serve an address other machines reach without a token: only when said in words
    #: (``serve`` refuses otherwise; both it and ``check-config`` warn then).
    insecure_no_token: bool = False
    #: Host names (the ``Host`` header) the server answers to besides loopback names and
    #: the address a request came in on: a proxy's public name, a compose service name.
    #: ``.example.com`` takes every sub-domain too; ``*`` takes any (no DNS-rebinding
    #: guard: only behind a proxy that checks ``Host`` itself).
    allowed_hosts: StrList = Field(default_factory=new_list)
    #: Open ``GET /logs/tail`` streams allowed per client address and in total (429 past).
    max_tails_per_client: int = Field(default=8, ge=1)
    max_tails: int = Field(default=32, ge=1)
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    max_tasks_per_request: int = Field(default=10000, ge=1)
    #: Seconds a request body may take to arrive in full; slower bodies are cut off
    #: with 408 so a client trickling bytes cannot hold a worker.
    body_timeout: Duration = Field(default=30.0, gt=0)

    @field_validator("token")
    @classmethod
    def _token_not_empty(cls, token: SecretStr | None) -> SecretStr | None:
        # An empty token would turn auth off without a word: refuse it, say how to.
        if token is not None and not token.get_secret_value().strip():
            raise ValueError(
                "the token is empty (a placeholder that resolved to '' counts): set a"
                " non-empty token, or write 'token: null' (or remove it) to run without auth"
            )
        if token is not None and len(token.get_secret_value().strip()) < MIN_TOKEN_LENGTH:
            # the length only: the error must not show any of the token
            raise ValueError(
                f"the token is {len(token.get_secret_value().strip())} characters long;"
                f" use at least {MIN_TOKEN_LENGTH} random ones (make one with: {MAKE_TOKEN})")
        return token

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_are_names(cls, hosts: list[str]) -> list[str]:
        cleaned = [h.strip().lower() for h in hosts]
        for host in cleaned:
            if not host or "/" in host or " " in host:
                raise ValueError(f"{host!r} is not a host name: list names like"
                                 " 'crawlhub.example.com' or '.example.com' (no scheme,"
                                 " no path)")
        return cleaned

    def exposure(self) -> str | None:
        """Why serving this section is unsafe, or None: a non-loopback ``bind`` without a
        token lets anyone who reaches the port run commands (jobs run argv)."""
        if self.token is not None or is_loopback(self.bind):
            return None
        return (f"server.bind is {self.bind!r} (reachable from other machines) and"
                " server.token is not set: anyone who reaches the port could start jobs,"
                " which run commands")

    @field_serializer("token", when_used="json")
    def _mask_token(self, token: SecretStr | None) -> str | None:
        return None if token is None else "***"


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["console", "json"] = "console"
    file: str | None = None
    #: More names (glob patterns) whose values are masked in dumps, URLs and log lines,
    #: besides the built-in ``*password*``, ``*token*``, ``*secret*``, ``*sign*``, ``*key*``...
    secret_names: StrList = Field(default_factory=new_list)
    #: Names never masked although a pattern matches them (e.g. ``sign_in_url``).
    public_names: StrList = Field(default_factory=new_list)

    def secrets(self) -> SecretNames:
        """The names this config masks: the built-in lists plus these two keys."""
        return SecretNames(self.secret_names, self.public_names)

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value


class CrawlhubConfig(_Section):
    """The whole config: one file plus its includes, merged and resolved."""

    project: str = "crawlhub"
    #: Value of the built-in ``submitter`` key on new tasks.
    submitter: str = "crawlhub"
    data_dir: str = DEFAULT_DATA_DIR
    #: Consumed by the loader: empty in a loaded config.
    include: StrList = Field(default_factory=new_list)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    failure: FailureConfig = Field(default_factory=FailureConfig)
    inbound: list[InboundConfig] = Field(default_factory=new_list)
    outbound: list[OutboundConfig] = Field(default_factory=new_list)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    frontier: Annotated[dict[str, FrontierConfig], BeforeValidator(as_dict)] = Field(default_factory=dict)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    jobs: list[CollectJobConfig] = Field(default_factory=new_list)
    #: how ``crawlhub agent`` downloads (crawlhub.agents.config)
    agent: AgentSection = Field(default_factory=AgentSection)
    #: the download center (crawlhub.center.config)
    center: CenterSection = Field(default_factory=CenterSection)
    #: the control plane: projects, builds, jobs, runs, logs, alerts (crawlhub.control.config)
    control: ControlSection = Field(default_factory=ControlSection)
    #: Scrapyd's JSON API on a port of its own (crawlhub.control.scrapyd.config)
    scrapyd: ScrapydSection = Field(default_factory=ScrapydSection)

    _config_path: Path | None = PrivateAttr(default=None)
    _settings: Settings | None = PrivateAttr(default=None)
    _files: list[str] = PrivateAttr(default_factory=new_list)
    _origins: dict[tuple[str, ...], str] = PrivateAttr(default_factory=dict)

    @field_validator("storage", "server", "routing", "failure", "logging", "agent",
                     "center", "control", "scrapyd", mode="before")
    @classmethod
    def _none_is_default(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("inbound", "outbound", "jobs", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value

    @model_validator(mode="after")
    def _defaults_under_data_dir(self) -> CrawlhubConfig:
        """Default storage URLs and the failure file live under ``data_dir``, also for a
        config built in Python (the loader fills every other placeholder)."""
        for section in (self.storage, self.failure, self.control, self.scrapyd):
            for name in type(section).model_fields:
                value = getattr(section, name)
                if (name not in section.model_fields_set and isinstance(value, str)
                        and "{data_dir}" in value):
                    setattr(section, name, value.replace("{data_dir}", self.data_dir))
        return self

    @property
    def config_path(self) -> Path | None:
        """The main config file, or None for the built-in default config."""
        return self._config_path

    @property
    def settings(self) -> Settings | None:
        """The settings the placeholders were resolved from (None for default_config)."""
        return self._settings

    @property
    def files(self) -> list[str]:
        """Every file loaded, main file first, as shown in error messages."""
        return list(self._files)

    def file_of(self, section: str, key: str | None = None) -> str | None:
        """The file that set ``section`` (or ``section.key``), as errors name files."""
        origins = self._origins
        found = origins.get((section, key)) if key is not None else None
        return found or origins.get((section,))

    def outbound_named(self, name: str) -> OutboundConfig | None:
        return next((o for o in self.outbound if o.name == name), None)

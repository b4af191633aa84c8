"""Pydantic models of the crawlhub config file: what each section and entry may hold.

The loader reads YAML, merges includes and resolves placeholders, then validates here.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from crawlhub.agents.config import AgentSection
from crawlhub.backends.urls import SCHEMES, Kind
from crawlhub.center.config import CenterSection
from crawlhub.collect.config import CollectJobConfig
from crawlhub.config.settings import DEFAULT_DATA_DIR, Settings
from crawlhub.control.config import ControlSection
from crawlhub.core.durations import parse_duration
from crawlhub.core.errors import ConfigError
from crawlhub.core.redact import SecretNames, redact_url
from crawlhub.core.task import BUILTIN_KEY_SET
from crawlhub.frontier.config import FrontierConfig
from crawlhub.pipeline.config import PipelineSection


def _optional_duration(value: Any) -> float | None:
    return None if value is None else parse_duration(value)


def _as_list(value: Any) -> Any:
    """``None`` -> ``[]``; one scalar -> ``[scalar]``; anything else unchanged."""
    if value is None:
        return []
    if isinstance(value, str | int | float):
        return [value]
    return value


def _selector_list(value: Any) -> Any:
    """Selectors are expressions in quotes: ``[42]`` or ``[true]`` is a mistake, not ``"42"``."""
    value = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(value, list):
        raise ValueError(
            f"expected a list of selector expressions (strings), got {value!r}; write e.g."
            " selector: [\"task_src == 3\"]"
        )
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(
                f"selector[{index}] is {item!r} ({type(item).__name__}), not a string: a"
                " selector is a Python expression in quotes, e.g. \"task_src == 3\""
            )
    return value


def _as_dict(value: Any) -> Any:
    return {} if value is None else value


def _status_code(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a status code (an integer or a string), got {value!r}")
    return value


#: Seconds; accepts ``30``, ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"1w"``, ``"1h30m"``.
Duration = Annotated[float, BeforeValidator(parse_duration)]
OptionalDuration = Annotated[float | None, BeforeValidator(_optional_duration)]
StatusCode = Annotated[int | str, BeforeValidator(_status_code)]
StatusList = Annotated[list[StatusCode], BeforeValidator(_as_list)]
StrList = Annotated[list[str], BeforeValidator(_as_list)]
FreeMapping = Annotated[dict[str, Any], BeforeValidator(_as_dict)]

_SCALAR = (str, int, float, bool, type(None))


class _Section(BaseModel):
    # YAML reads `name: 2021` as an int; a str field takes it as "2021".
    model_config = ConfigDict(extra="forbid", populate_by_name=True, coerce_numbers_to_str=True)


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
    redis_prefix: str = "crawlhub:"

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
#: Names of this machine that a page on another site can never make a browser use for us.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback(host: str) -> bool:
    """True for ``localhost``, ``127.0.0.0/8`` and ``::1``: addresses only this machine
    reaches. Any other name or address (``0.0.0.0``, ``::``, a LAN address, a host name)
    may be reached from elsewhere."""
    import ipaddress

    host = host.strip().lower().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    allowed_hosts: StrList = Field(default_factory=list)
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


class RoutingConfig(_Section):
    limits: int = Field(default=-1, ge=-1)
    terminal_codes: StatusList = Field(default_factory=lambda: list[int | str]([1000]))
    #: Default result timeout for outbounds that set none (None: wait forever).
    result_timeout: OptionalDuration = None


class FailureConfig(_Section):
    path: str = "{data_dir}/failures.jsonl"
    compress: bool = False


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["console", "json"] = "console"
    file: str | None = None
    #: More names (glob patterns) whose values are masked in dumps, URLs and log lines,
    #: besides the built-in ``*password*``, ``*token*``, ``*secret*``, ``*sign*``, ``*key*``...
    secret_names: StrList = Field(default_factory=list)
    #: Names never masked although a pattern matches them (e.g. ``sign_in_url``).
    public_names: StrList = Field(default_factory=list)

    def secrets(self) -> SecretNames:
        """The names this config masks: the built-in lists plus these two keys."""
        return SecretNames(self.secret_names, self.public_names)

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value


class ConvertConfig(_Section):
    class_: str = Field(alias="class", min_length=1)
    init: FreeMapping = Field(default_factory=dict)


def _convert_list(value: Any) -> Any:
    value = _as_list(value)
    if isinstance(value, list):
        return [{"class": item} if isinstance(item, str) else item for item in value]
    return value


class _Entry(_Section):
    """What inbounds and outbounds share: a name, a place in a file, selectors."""

    kind: ClassVar[str] = "entry"

    name: str = Field(min_length=1)
    disable: bool = False
    selector: Annotated[list[str], BeforeValidator(_selector_list)] = Field(default_factory=list)
    init: FreeMapping = Field(default_factory=dict)

    _source_file: str | None = PrivateAttr(default=None)
    _source_index: int | None = PrivateAttr(default=None)

    @property
    def source_file(self) -> str | None:
        """The config file this entry came from, relative to the main file's folder."""
        return self._source_file

    @property
    def source_index(self) -> int | None:
        """The entry's index in its file's ``inbound``/``outbound`` list."""
        return self._source_index

    @property
    def label(self) -> str:
        """How errors name this entry, e.g. ``outbound[1] 'o_b_1'``."""
        index = "" if self._source_index is None else f"[{self._source_index}]"
        return f"{self.kind}{index} '{self.name}'"

    def error(self, message: str, *, key: str | None = None) -> ConfigError:
        """A ConfigError located at this entry (for the hub: unknown class, bad init)."""
        return ConfigError(message, file=self._source_file, entry=self.label, key=key)

    def set_source(self, file: str | None, index: int | None) -> None:
        self._source_file = file
        self._source_index = index


class InboundConfig(_Entry):
    kind: ClassVar[str] = "inbound"

    weight: int = Field(default=1, ge=0)
    #: "http", "redis", "kafka", "kafka.KafkaInbound", "module.path:Class", ...
    class_: str = Field(alias="class", min_length=1)
    convert: Annotated[list[ConvertConfig], BeforeValidator(_convert_list)] = Field(
        default_factory=list
    )
    threads: int = Field(default=1, ge=1)
    derive: bool = False
    frontier: str | None = None


class OutboundConfig(_Entry):
    """One outbound. Keys that are not options become ``static_params`` (e.g. task_src: 3)."""

    kind: ClassVar[str] = "outbound"

    #: "queue", "redis_list", "redis_queue.RedisListOutbound", "module:Class", ...
    class_: str = Field(default="queue", alias="class", min_length=1)
    #: None: every non-built-in key of the task.
    task_params: StrList | None = None
    task_params_wrapped: bool = False
    priority: int = 0
    rt_priority: int | None = None
    retry_limits: int = Field(default=3, ge=0)
    dont_retry_status: StatusList = Field(default_factory=list)
    direct_failback_status: StatusList = Field(default_factory=list)
    failback: str | None = None
    reset_retry_times: bool = False
    max_lag: int = -1
    token_scope: str | None = None
    token_per_second: float | None = Field(default=None, gt=0)
    result_timeout: OptionalDuration = None
    frontier: str | None = None
    static_params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _collect_static_params(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        options, static, problems = split_static_params(data)
        if problems:
            raise ValueError("; ".join(f"key {key!r}: {message}" for key, message in problems))
        if static:
            options["static_params"] = {**(options.get("static_params") or {}), **static}
        return options

    @field_validator("task_params", mode="before")
    @classmethod
    def _task_params(cls, value: Any) -> Any:
        return value if value is None else _as_list(value)

    @field_validator("max_lag")
    @classmethod
    def _max_lag(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError(f"max_lag must be -1 (unlimited) or >= 1, got {value}")
        return value

    @field_validator("static_params")
    @classmethod
    def _static_scalars(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            problem = _static_value_problem(key, item)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("failback")
    @classmethod
    def _failback_not_self(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and value == info.data.get("name"):
            raise ValueError(
                f"failback {value!r} names this outbound itself: "
                "name another outbound, or remove failback"
            )
        return value


def outbound_option_names() -> frozenset[str]:
    """Every key an outbound entry understands as an option (aliases and field names)."""
    names: set[str] = set()
    for field_name, field in OutboundConfig.model_fields.items():
        names.add(field_name)
        if field.alias:
            names.add(field.alias)
    return frozenset(names)


_INBOUND_ONLY = frozenset({"weight", "convert", "threads", "derive"})


def split_static_params(
    data: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, str]]]:
    """Split an outbound mapping into (options, static params, [(key, problem), ...]).

    A key that is not an option is a static task param when its value is a scalar or a
    list of scalars. It is a problem when it is a built-in task key, an inbound-only
    option, a near-miss of an option name (difflib ratio >= 0.8), or holds a mapping.
    """
    known = outbound_option_names()
    visible = sorted(n for n in known if n != "class_")
    options: dict[str, Any] = {}
    static: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for key, value in data.items():
        if key in known:
            options[key] = value
            continue
        key_text = str(key)
        if key_text in BUILTIN_KEY_SET:
            problems.append(
                (
                    key_text,
                    f"'{key_text}' is a built-in task key the hub sets itself; "
                    "it cannot be an outbound option or a static task param",
                )
            )
            continue
        if key_text in _INBOUND_ONLY:
            problems.append(
                (key_text, f"'{key_text}' is an inbound option; outbounds do not take it")
            )
            continue
        close = difflib.get_close_matches(key_text, visible, n=1, cutoff=0.8)
        if close:
            problems.append(
                (
                    key_text,
                    f"unknown key '{key_text}' — did you mean '{close[0]}'? "
                    "Static task params must not look like option names",
                )
            )
            continue
        problem = _static_value_problem(key_text, value)
        if problem:
            problems.append((key_text, problem))
            continue
        static[key_text] = value
    return options, static, problems


def _static_value_problem(key: str, value: Any) -> str | None:
    if isinstance(value, _SCALAR):
        return None
    if isinstance(value, list) and all(isinstance(item, _SCALAR) for item in value):
        return None
    kind = "a mapping" if isinstance(value, Mapping) else "a list holding mappings or lists"
    return (
        f"static task param '{key}' holds {kind}; static params must be a scalar "
        "(string, number, boolean, null) or a list of scalars (is it a misspelt option?)"
    )


class CrawlhubConfig(_Section):
    """The whole config: one file plus its includes, merged and resolved."""

    project: str = "crawlhub"
    #: Value of the built-in ``submitter`` key on new tasks.
    submitter: str = "crawlhub"
    data_dir: str = DEFAULT_DATA_DIR
    #: Consumed by the loader: empty in a loaded config.
    include: StrList = Field(default_factory=list)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    failure: FailureConfig = Field(default_factory=FailureConfig)
    inbound: list[InboundConfig] = Field(default_factory=list)
    outbound: list[OutboundConfig] = Field(default_factory=list)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    frontier: Annotated[dict[str, FrontierConfig], BeforeValidator(_as_dict)] = Field(default_factory=dict)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    jobs: list[CollectJobConfig] = Field(default_factory=list)
    #: how ``crawlhub agent`` downloads (crawlhub.agents.config)
    agent: AgentSection = Field(default_factory=AgentSection)
    #: the download center (crawlhub.center.config)
    center: CenterSection = Field(default_factory=CenterSection)
    #: the control plane: projects, builds, jobs, runs, logs, alerts (crawlhub.control.config)
    control: ControlSection = Field(default_factory=ControlSection)

    _config_path: Path | None = PrivateAttr(default=None)
    _settings: Settings | None = PrivateAttr(default=None)
    _files: list[str] = PrivateAttr(default_factory=list)
    _origins: dict[tuple[str, ...], str] = PrivateAttr(default_factory=dict)

    @field_validator("storage", "server", "routing", "failure", "logging", "agent",
                     "center", "control", mode="before")
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
        for section in (self.storage, self.failure, self.control):
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

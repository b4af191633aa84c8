"""The hub's config models: routing, failures, and the inbound and outbound entries.

An outbound's keys that are not options become its static task params.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from crawlhub.core.configtypes import (
    FreeMapping,
    OptionalDuration,
    StatusList,
    StrList,
    as_list,
    new_list,
)
from crawlhub.core.configtypes import Section as _Section
from crawlhub.core.errors import ConfigError
from crawlhub.core.task import BUILTIN_KEY_SET

_SCALAR = (str, int, float, bool, type(None))


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


class RoutingConfig(_Section):
    limits: int = Field(default=-1, ge=-1)
    terminal_codes: StatusList = Field(default_factory=lambda: list[int | str]([1000]))
    #: Default result timeout for outbounds that set none (None: wait forever).
    result_timeout: OptionalDuration = None


class FailureConfig(_Section):
    path: str = "{data_dir}/failures.jsonl"
    compress: bool = False


class ConvertConfig(_Section):
    class_: str = Field(alias="class", min_length=1)
    init: FreeMapping = Field(default_factory=dict)


def _convert_list(value: Any) -> Any:
    value = as_list(value)
    if isinstance(value, list):
        return [{"class": item} if isinstance(item, str) else item for item in value]
    return value


class _Entry(_Section):
    """What inbounds and outbounds share: a name, a place in a file, selectors."""

    kind: ClassVar[str] = "entry"

    name: str = Field(min_length=1)
    disable: bool = False
    selector: Annotated[list[str], BeforeValidator(_selector_list)] = Field(default_factory=new_list)
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
        default_factory=new_list
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
    dont_retry_status: StatusList = Field(default_factory=new_list)
    direct_failback_status: StatusList = Field(default_factory=new_list)
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
        return value if value is None else as_list(value)

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

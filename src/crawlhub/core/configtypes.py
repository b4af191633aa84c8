"""What the config models of every component share: the base of a config section and the
annotated field types (durations, lists that also take one scalar, status codes).

Components own their config models (``hub.config``, ``frontier.config``, ...); ``config``
composes them into the whole file's model.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from crawlhub.core.durations import parse_duration


def _optional_duration(value: Any) -> float | None:
    return None if value is None else parse_duration(value)


def new_list() -> list[Any]:
    """``[]``, as a ``default_factory``: pydantic reads the signature of every factory, and
    ``list``'s is parsed from text by the tokenizer (~0.1 ms a field, the first ~5 ms;
    together ~8 ms of ``crawlhub serve``'s start-up). A function's is read at once."""
    return []


def as_list(value: Any) -> Any:
    """``None`` -> ``[]``; one scalar -> ``[scalar]``; anything else unchanged."""
    if value is None:
        return []
    if isinstance(value, str | int | float):
        return [value]
    return value


def as_dict(value: Any) -> Any:
    return {} if value is None else value


def _status_code(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a status code (an integer or a string), got {value!r}")
    return value


#: Seconds; accepts ``30``, ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"1w"``, ``"1h30m"``.
Duration = Annotated[float, BeforeValidator(parse_duration)]
OptionalDuration = Annotated[float | None, BeforeValidator(_optional_duration)]
StatusCode = Annotated[int | str, BeforeValidator(_status_code)]
StatusList = Annotated[list[StatusCode], BeforeValidator(as_list)]
StrList = Annotated[list[str], BeforeValidator(as_list)]
FreeMapping = Annotated[dict[str, Any], BeforeValidator(as_dict)]


class Section(BaseModel):
    # YAML reads `name: 2021` as an int; a str field takes it as "2021".
    model_config = ConfigDict(extra="forbid", populate_by_name=True, coerce_numbers_to_str=True)

"""The builders by name: :data:`BUILDERS` (``venv``, ``wheel``, ``docker``, ``image``, ``command``;
:func:`register` adds one), a project's options checked against its builder's, and the
builder a build runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from crawlhub.control.builders.artifact import BuildFailed
from crawlhub.control.builders.command import CommandBuilder
from crawlhub.control.builders.context import Builder
from crawlhub.control.builders.docker import DockerBuilder
from crawlhub.control.builders.image import ImageBuilder
from crawlhub.control.builders.venv import VenvBuilder
from crawlhub.control.builders.wheel import WheelBuilder

BUILDERS: dict[str, Any] = {b.name: b for b in (VenvBuilder, WheelBuilder, DockerBuilder,
                                                  ImageBuilder, CommandBuilder)}


def register(builder: Any) -> None:
    """Add a builder class (``name``, ``Options``, ``__init__(options)``, ``build``)."""
    BUILDERS[builder.name] = builder


def check_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` of builder ``name`` validated (defaults filled); ValueError saying
    what is wrong otherwise."""
    cls = BUILDERS.get(name)
    if cls is None:
        raise ValueError(f"unknown builder {name!r}; use one of {', '.join(sorted(BUILDERS))}")
    try:
        return dict(cls.Options.model_validate(dict(options or {})).model_dump())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
                             for e in exc.errors())
        raise ValueError(f"builder {name!r} options: {problems}") from None


def make_builder(name: str, options: Mapping[str, Any] | None) -> Builder:
    cls = BUILDERS.get(name)
    if cls is None:
        raise BuildFailed(f"unknown builder {name!r}; use one of {', '.join(sorted(BUILDERS))}")
    return cls(cls.Options.model_validate(dict(options or {})))  # type: ignore[no-any-return]

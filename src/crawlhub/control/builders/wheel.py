"""The ``wheel`` builder: ``pip wheel --no-deps`` of the tag; a job imports the wheel
from ``PYTHONPATH``."""

from __future__ import annotations

import sys
from typing import ClassVar

from pydantic import Field

from crawlhub.control.builders.artifact import Artifact, BuildFailed
from crawlhub.control.builders.context import BuildContext, BuilderOptions, packaged
from crawlhub.core.configtypes import new_list


class WheelBuilder:
    """A wheel of the tag (``pip wheel --no-deps``); a job imports it from ``PYTHONPATH``
    (a pure-Python wheel is importable as it is)."""

    name: ClassVar[str] = "wheel"

    class Options(BuilderOptions):
        pip_args: list[str] = Field(default_factory=new_list, max_length=50,
                                    description="extra arguments of pip wheel")

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        if not packaged(ctx.src):
            raise BuildFailed("the tag has no pyproject.toml or setup.py: there is nothing"
                              " to build a wheel from (the venv builder takes plain scripts)")
        dist = ctx.root / "dist"
        await ctx.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                       "--no-input", "wheel", "--no-deps", "-w", str(dist),
                       *self.options.pip_args, "."], what="pip wheel")
        wheels = sorted(dist.glob("*.whl"))
        if not wheels:
            raise BuildFailed(f"pip wheel made no .whl file in {dist}")
        return ctx.artifact("wheel", wheels[0], workdir=ctx.src,
                            env={"PYTHONPATH": str(wheels[0])})

"""The ``command`` builder: the project's own build command (an argv, no shell) run in
the clone; what it leaves there is the artifact."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from crawlhub.control.builders.artifact import Artifact, BuildFailed
from crawlhub.control.builders.context import BuildContext, BuilderOptions, relative


class CommandBuilder:
    """The project's own build command (an argv, no shell) run in the clone; the
    directory (or file) ``artifact`` it leaves is the artifact."""

    name: ClassVar[str] = "command"

    class Options(BuilderOptions):
        argv: list[str] = Field(min_length=1, max_length=200,
                                description="the command and its arguments (no shell)")
        artifact: str = Field(".", description="what it leaves, relative to the clone")
        kind: Literal["dir", "venv", "wheel"] = Field("dir", description="what that is")

        @field_validator("argv")
        @classmethod
        def _argv(cls, value: list[str]) -> list[str]:
            if not value[0].strip():
                raise ValueError("argv[0] is empty")
            return value

        @field_validator("artifact")
        @classmethod
        def _inside(cls, value: str) -> str:
            return value if value == "." else relative(value, "artifact")

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        opts = self.options
        await ctx.run(list(opts.argv), env={"CRAWLHUB_BUILD_DIR": str(ctx.root)},
                      what="the build command")
        path = (ctx.src / opts.artifact).resolve()
        if not path.is_relative_to(ctx.root.resolve()) or not path.exists():
            raise BuildFailed(f"the build command left no {opts.artifact!r} in the clone")
        if opts.kind == "venv":
            return ctx.artifact("venv", path, workdir=ctx.src, bin_dir=path / "bin",
                                env={"VIRTUAL_ENV": str(path)})
        if opts.kind == "wheel":
            return ctx.artifact("wheel", path, workdir=ctx.src, env={"PYTHONPATH": str(path)})
        return ctx.artifact("dir", path, workdir=ctx.src)

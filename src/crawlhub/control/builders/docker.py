"""The ``docker`` builder: ``docker build -t crawlhub/<project>:<version> .`` in the
clone, when a Docker engine answers ``docker info``."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from crawlhub.control.builders.artifact import Artifact, BuildFailed
from crawlhub.control.builders.context import BuildContext, BuilderOptions, relative
from crawlhub.control.builders.process import run_process

_IMAGE_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


def image_name(project: str) -> str:
    """``crawlhub/<project>`` as Docker allows it (lower case, separators single)."""
    name = re.sub(r"[^a-z0-9]+", "-", project.lower()).strip("-") or "project"
    return f"crawlhub/{name}"


class DockerBuilder:
    """``docker build -t crawlhub/<project>:<version> .`` in the clone, when a Docker
    engine answers ``docker info``."""

    name: ClassVar[str] = "docker"

    class Options(BuilderOptions):
        dockerfile: str = Field("Dockerfile", description="relative to the clone")
        image: str | None = Field(None, description="the image's repository name"
                                  " (default crawlhub/<project>)")
        build_args: dict[str, str] = Field(default_factory=dict, max_length=50,
                                           description="--build-arg NAME=VALUE (not for"
                                           " secrets: options are shown)")
        docker: str = Field("docker", description="the docker program")

        @field_validator("dockerfile")
        @classmethod
        def _inside(cls, value: str) -> str:
            return relative(value, "dockerfile")

        @field_validator("image")
        @classmethod
        def _image(cls, value: str | None) -> str | None:
            if value is not None and not _IMAGE_RE.match(value):
                raise ValueError(f"image {value!r} is not a Docker repository name (lower"
                                 " case letters, digits, '.', '_', '-', '/')")
            return value

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        opts = self.options
        lines: list[str] = []
        try:
            code = await run_process([opts.docker, "info", "--format", "{{.ServerVersion}}"],
                                     cwd=ctx.root, env=ctx.env,
                                     timeout=min(20.0, ctx.remaining()), write=lines.append)
        except BuildFailed as exc:
            code, lines = -1, [str(exc)]
        if code != 0:
            why = next((ln for ln in reversed(lines) if ln.strip()), f"exit {code}")
            ctx.say(f"docker info: {why}")
            raise BuildFailed("no Docker engine answers (docker info failed: "
                              f"{ctx.log.redact(why)[:200]}); start Docker, or choose the venv"
                              " or wheel builder")
        if not (ctx.src / opts.dockerfile).is_file():
            raise BuildFailed(f"the tag has no {opts.dockerfile}")
        tag = f"{opts.image or image_name(ctx.project)}:{re.sub(r'[^A-Za-z0-9_.-]', '_', ctx.version)}"
        argv = [opts.docker, "build", "-t", tag, "-f", opts.dockerfile]
        for name, value in opts.build_args.items():
            argv += ["--build-arg", f"{name}={value}"]
        await ctx.run([*argv, "."], what="docker build")
        return ctx.artifact("image", tag)

"""The ``image`` builder: an OCI image of the release, ``crawlhub/<project>:<version>``, for
jobs run with ``runtime: container`` (the engine's CLI, podman by default; docker takes the
same arguments).

- The tag has a ``Containerfile`` or ``Dockerfile`` (or the one ``containerfile`` names):
  ``podman build`` with it, in the clone.
- It has none: the default recipe. A build context holding the clone at ``/app`` (the
  working directory), the project's requirements installed (``requirements.txt``, or the
  project itself when it has ``pyproject.toml``/``setup.py``) by this server's pip into the
  base image's site directory, and crawlhub's own package (the job SDK) beside them, on
  top of ``base`` (``localhost/crawlhub-base:1`` by default: a Python with its standard
  library, ``crawlhub builds base-image`` builds it). pip runs on the host, not
  in a container: a base image needs neither pip nor a network. When the base's Python
  is not the host's, pip fetches binary wheels for the base's version.

The artifact keeps the image's id and size; the build log has every step. Only the
newest ``keep`` images of the project stay (older tags are removed; one a container
still uses stays until it is free).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

import crawlhub
from crawlhub.control.builders.artifact import Artifact, BuildFailed
from crawlhub.control.builders.baseimage import BASE_IMAGE
from crawlhub.control.builders.context import BuildContext, BuilderOptions, packaged, relative
from crawlhub.control.builders.process import run_process
from crawlhub.core.configtypes import new_list

DEFAULT_BASE = BASE_IMAGE
_REF_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]{0,250}$")


def image_name(project: str) -> str:
    """``crawlhub/<project>`` as image names allow it (lower case, separators single)."""
    name = re.sub(r"[^a-z0-9]+", "-", project.lower()).strip("-") or "project"
    return f"crawlhub/{name}"


class ImageBuilder:
    """See the module docstring."""

    name: ClassVar[str] = "image"

    class Options(BuilderOptions):
        containerfile: str | None = Field(None, description="relative to the clone; default"
                                          " Containerfile, then Dockerfile, else the recipe")
        base: str = Field(DEFAULT_BASE, description="the default recipe's base image")
        image: str | None = Field(None, description="the image's repository name"
                                  " (default crawlhub/<project>)")
        keep: int = Field(5, ge=1, le=1000, description="images of the project kept")
        engine: str = Field("podman", description="the engine's program (podman, docker)")
        pip_args: list[str] = Field(default_factory=new_list, max_length=50, description="more"
                                    " pip install arguments of the recipe (--no-index,"
                                    " --find-links DIR, --index-url URL: not for secrets)")

        @field_validator("containerfile")
        @classmethod
        def _inside(cls, value: str | None) -> str | None:
            return None if value is None else relative(value, "containerfile")

        @field_validator("base", "image")
        @classmethod
        def _ref(cls, value: str | None) -> str | None:
            if value is not None and not _REF_RE.match(value):
                raise ValueError(f"{value!r} is not an image reference (lower case letters,"
                                 " digits, '.', '_', '-', '/', ':')")
            return value

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        opts = self.options
        await self._engine_answers(ctx)
        repo = opts.image or image_name(ctx.project)
        tag = f"{repo}:{re.sub(r'[^A-Za-z0-9_.-]', '_', ctx.version)}"
        named = [opts.containerfile] if opts.containerfile else ["Containerfile", "Dockerfile"]
        found = next((n for n in named if (ctx.src / n).is_file()), None)
        if opts.containerfile and found is None:
            raise BuildFailed(f"the tag has no {opts.containerfile}")
        if found is not None:
            ctx.say(f"building {tag} from the project's {found}")
            await ctx.run([opts.engine, "build", "-t", tag, "-f", found, "."],
                          what=f"{opts.engine} build")
        else:
            await self._recipe(ctx, tag)
        meta = await self._inspect(ctx, tag)
        ctx.say(f"image {tag}: id {str(meta['id'])[:12]}, {meta['size']} bytes")
        await self._prune(ctx, repo, tag)
        return ctx.artifact("image", tag, meta=meta)

    async def _engine_answers(self, ctx: BuildContext) -> None:
        engine = self.options.engine
        lines: list[str] = []
        try:
            code = await run_process([engine, "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                                     cwd=ctx.root, env=ctx.env,
                                     timeout=min(60.0, ctx.remaining()), write=lines.append)
        except BuildFailed as exc:
            code, lines = -1, [str(exc)]
        if code != 0:
            why = next((ln for ln in reversed(lines) if ln.strip()), f"exit {code}")
            ctx.say(f"{engine} info: {why}")
            raise BuildFailed(f"no container engine answers ({engine} info failed:"
                              f" {ctx.log.redact(why)[:200]}); install podman (apt-get install"
                              " podman runc), or choose the venv or wheel builder")

    async def _base_python(self, ctx: BuildContext) -> tuple[str, str]:
        """The base image's Python version (3.11) and site directory."""
        out: list[str] = []
        code = await run_process(
            [self.options.engine, "run", "--rm", "--network", "none", self.options.base,
             "python3", "-c", "import site, sys; print('%d.%d' % sys.version_info[:2],"
             " site.getsitepackages()[0])"],
            cwd=ctx.root, env=ctx.env, timeout=min(120.0, ctx.remaining()), write=out.append)
        last = next((ln for ln in reversed(out) if ln.strip()), "")
        parts = last.split()
        if code != 0 or len(parts) != 2 or not parts[1].startswith("/"):
            raise BuildFailed(f"the base image {self.options.base} does not run python3"
                              f" ({ctx.log.redact(last)[:200] or f'exit {code}'}); build it"
                              " (crawlhub builds base-image) or set the builder's"
                              " base option")
        return parts[0], parts[1]

    async def _recipe(self, ctx: BuildContext, tag: str) -> None:
        """The default recipe (no Containerfile): base + the project + its requirements +
        crawlhub's package."""
        opts = self.options
        version, site = await self._base_python(ctx)
        ctx.say(f"no Containerfile: the default recipe on {self.options.base} (Python"
                f" {version}, packages into {site})")
        context = ctx.root / "image"
        shutil.copytree(ctx.src, context / "app", ignore=shutil.ignore_patterns(".git"))
        deps = context / "deps"
        deps.mkdir()
        shutil.copytree(Path(crawlhub.__file__).resolve().parent, deps / "crawlhub",
                        ignore=shutil.ignore_patterns("__pycache__"))
        wanted: list[str] = []
        if packaged(ctx.src):
            wanted = [str(context / "app")]
        elif (ctx.src / "requirements.txt").is_file():
            wanted = ["-r", str(context / "app" / "requirements.txt")]
        if wanted:
            host = f"{sys.version_info[0]}.{sys.version_info[1]}"
            pip = [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                   "--target", str(deps)]
            if version != host:  # binary wheels of the base's Python, not the host's
                pip += ["--python-version", version, "--only-binary=:all:"]
            await ctx.run([*pip, *opts.pip_args, *wanted],
                          what="pip install (the project's requirements)")
        (context / "Containerfile").write_text(
            f"FROM {self.options.base}\n"
            f"COPY deps/ {site}/\n"
            "COPY app/ /app/\n"
            "WORKDIR /app\n")
        await ctx.run([self.options.engine, "build", "-t", tag, "-f", "Containerfile", "."],
                      cwd=context, what=f"{self.options.engine} build")

    async def _inspect(self, ctx: BuildContext, tag: str) -> dict[str, str | int]:
        out: list[str] = []
        code = await run_process([self.options.engine, "image", "inspect", tag, "--format",
                                  "{{.Id}} {{.Size}}"], cwd=ctx.root, env=ctx.env,
                                 timeout=min(60.0, ctx.remaining()), write=out.append)
        parts = (out[-1] if out else "").split()
        if code != 0 or len(parts) != 2 or not parts[1].isdigit():
            raise BuildFailed(f"the engine built {tag} but cannot say what it is: {out[-1:]}")
        return {"id": parts[0], "size": int(parts[1])}

    async def _prune(self, ctx: BuildContext, repo: str, keep_tag: str) -> None:
        """Remove the project's images beyond the newest ``keep``."""
        out: list[str] = []
        engine = self.options.engine
        code = await run_process([engine, "images", "--format", "json"], cwd=ctx.root,
                                 env=ctx.env, timeout=min(60.0, ctx.remaining()),
                                 write=out.append)
        if code != 0:
            ctx.say("cannot list the images to prune; the old ones stay")
            return
        with contextlib.suppress(ValueError):
            rows = json.loads("\n".join(out) or "[]") or []
            tags: list[tuple[float, str]] = []
            for row in rows:
                for name in row.get("Names") or []:
                    if name.rpartition(":")[0] in (repo, f"localhost/{repo}"):
                        tags.append((float(row.get("Created") or 0), name))
            tags.sort(reverse=True)
            kept = 0
            for _, name in tags:
                if name.endswith(keep_tag) or kept < self.options.keep - 1:
                    kept += not name.endswith(keep_tag)
                    continue
                ctx.say(f"pruning {name} (keep {self.options.keep})")
                await ctx.run([engine, "rmi", name], check=False)

"""What a builder sees: a :class:`BuildContext` (the build's directories, options,
deadline and log; every process through :meth:`BuildContext.run`), and the
:class:`Builder` protocol a way to build implements."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from crawlhub.control.builders.artifact import Artifact, BuildFailed
from crawlhub.control.builders.buildlog import BuildLog
from crawlhub.control.builders.process import run_process


@dataclass
class BuildContext:
    """One build's directories, options, deadline and log, as a builder sees them.

    ``root`` is ``<builds_dir>/<project>/<version>-<build id>``, fresh for this build;
    ``src`` is the clone of the tag inside it (``root/src``)."""

    project: str
    version: str
    build: int
    ref: str
    root: Path
    options: dict[str, Any]
    log: BuildLog
    deadline: float  # time.monotonic() value
    env: dict[str, str] = field(default_factory=dict)
    commit: str = ""

    @property
    def src(self) -> Path:
        return self.root / "src"

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise BuildFailed("the build ran over its time limit (control.build_timeout)")
        return left

    def say(self, message: str) -> None:
        """A line of crawlhub's own in the build log (``--- ...``)."""
        self.log.write(f"--- {message}")

    async def run(self, argv: list[str], *, cwd: Path | None = None,
                  env: Mapping[str, str] | None = None, check: bool = True,
                  what: str | None = None) -> int:
        """Run ``argv`` in ``cwd`` (default: the clone) with the build's environment
        (``env`` added); output into the log. A non-zero exit is a :class:`BuildFailed`
        naming ``what`` (default: the program) unless ``check`` is false."""
        self.say("$ " + " ".join(shown(a) for a in argv))
        full = {**self.env, **(env or {})}
        code = await run_process(argv, cwd=cwd or self.src, env=full,
                                 timeout=self.remaining(), write=self.log.write)
        if check and code != 0:
            raise BuildFailed(f"{what or Path(argv[0]).name} failed (exit {code}); see the"
                              " build log")
        return code

    def artifact(self, kind: str, path: Path | str, *, workdir: Path | None = None,
                 bin_dir: Path | None = None, env: Mapping[str, str] | None = None,
                 meta: Mapping[str, Any] | None = None) -> Artifact:
        base = {"CRAWLHUB_PROJECT": self.project, "CRAWLHUB_VERSION": self.version}
        return Artifact(project=self.project, version=self.version, kind=kind,
                        path=str(path), workdir=str(workdir) if workdir else None,
                        bin_dir=str(bin_dir) if bin_dir else None,
                        env={**base, **(env or {})}, build=self.build, commit=self.commit,
                        meta=dict(meta or {}))


def shown(arg: str) -> str:
    return arg if arg and not re.search(r"[\s'\"\\$`]", arg) else repr(arg)


class Builder(Protocol):
    """A way to build: ``name`` (what projects choose), ``Options`` (a pydantic model of
    its options, checked when a project is saved) and ``build``."""

    name: ClassVar[str]
    Options: ClassVar[type[BaseModel]]

    async def build(self, ctx: BuildContext) -> Artifact: ...


class BuilderOptions(BaseModel):
    """The base of a builder's ``Options``: unknown options are refused."""

    model_config = ConfigDict(extra="forbid")


def packaged(src: Path) -> bool:
    """Whether the tree ``src`` is a Python project (``pyproject.toml`` or ``setup.py``)."""
    return (src / "pyproject.toml").is_file() or (src / "setup.py").is_file()


def relative(value: str, what: str) -> str:
    """``value`` if it is a path inside the clone; ValueError naming ``what`` if not."""
    path = Path(value)
    if path.is_absolute() or ".." in path.parts or not value.strip():
        raise ValueError(f"{what} {value!r} must be a path inside the clone (relative, no"
                         " '..')")
    return value

"""What a build leaves for jobs: an :class:`Artifact` (a venv, a wheel, an image or a
directory), and :class:`BuildFailed`, the one error of a build."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crawlhub.core.errors import CrawlhubError

#: Artifact kinds a job runner knows.
KINDS = ("dir", "venv", "wheel", "image", "egg")


class BuildFailed(CrawlhubError):
    """A build step failed; the message is the build's one-line reason."""


@dataclass(frozen=True)
class Artifact:
    """What a successful build leaves for jobs (``BuildService.artifact``).

    - ``kind``: ``venv`` (``path`` is the virtualenv), ``wheel`` (``path`` is the .whl
      file), ``image`` (``path`` is the Docker image tag), ``dir`` (``path`` a directory);
    - ``workdir``: the clone of the tag, where a job's command runs (None for an image);
    - ``bin_dir``: put first on ``PATH`` (``venv/bin``), or None;
    - ``env``: variables a job's process gets on top of its own (``VIRTUAL_ENV``,
      ``PYTHONPATH`` for a wheel, ``CRAWLHUB_PROJECT``/``CRAWLHUB_VERSION``); use
      :meth:`environ` to merge them with ``PATH``;
    - ``egg``: an uploaded Scrapy egg (``path``, Scrapyd's ``addversion.json``), run in
      ``workdir`` on the server's Python (:mod:`crawlhub.control.scrapyd`).
    """

    project: str
    version: str
    kind: str
    path: str
    workdir: str | None = None
    bin_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    build: int = 0
    commit: str = ""
    #: what the builder says of it beyond its path (an image: its id and size in bytes)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def python(self) -> str | None:
        """The interpreter of a ``venv`` artifact."""
        return str(Path(self.bin_dir) / "python") if self.bin_dir else None

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: ``os.environ``) with :attr:`env` on top and :attr:`bin_dir`
        first on ``PATH``; ``PYTHONPATH`` entries are prepended, not replaced."""
        out = dict(os.environ if base is None else base)
        for name, value in self.env.items():
            if name == "PYTHONPATH" and out.get(name):
                out[name] = value + os.pathsep + out[name]
            else:
                out[name] = value
        if self.bin_dir:
            out["PATH"] = self.bin_dir + (os.pathsep + out["PATH"] if out.get("PATH") else "")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "workdir": self.workdir,
                "bin_dir": self.bin_dir, "env": dict(self.env), "meta": dict(self.meta)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, project: str, version: str, build: int,
                  commit: str) -> Artifact:
        return cls(project=project, version=version, kind=str(data["kind"]),
                   path=str(data["path"]), workdir=data.get("workdir"),
                   bin_dir=data.get("bin_dir"), env=dict(data.get("env") or {}),
                   build=build, commit=commit, meta=dict(data.get("meta") or {}))

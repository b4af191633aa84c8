"""Builders: turn a fresh clone of a project's release tag into the artifact a job runs
(a virtualenv, a wheel, a Docker image, a directory). One class per way, chosen by name.

:class:`crawlhub.control.builds.BuildService` clones the tag (:func:`clone`: credentials
through ``GIT_ASKPASS``, never in a URL, an argv or a log line), then hands a
:class:`BuildContext` to the project's builder, whose one method is
``async build(ctx) -> Artifact``. Every process a build runs goes through
:meth:`BuildContext.run`: an argv list (never a shell), the build's deadline, stdout and
stderr captured line by line into the build log with the project's secrets masked.

Builders (``BUILDERS``; :func:`register` adds one):

- ``venv`` (default): ``python -m venv --without-pip``; then ``pip install .`` when the tree
  has ``pyproject.toml``/``setup.py``, else ``pip install -r requirements.txt`` when it has
  one, else nothing (plain scripts run with the venv's python). pip is this process's own,
  pointed at the venv (``pip --python``), so no copy of pip is installed per build.
- ``wheel``: ``pip wheel --no-deps -w dist .``; a job imports it from ``PYTHONPATH``.
- ``docker``: ``docker build -t crawlhub/<project>:<version> .`` when ``docker info``
  answers; otherwise the build fails saying no Docker engine answers.
- ``image``: an OCI image ``crawlhub/<project>:<version>`` for container jobs, from the
  tag's Containerfile/Dockerfile or a default recipe (base image + requirements + the
  SDK); keeps its id and size, prunes to the newest ``keep`` (:mod:`.image`).
- ``command``: an argv of the project's own, run in the clone; its output directory is the
  artifact.

Modules (each imports only those above it): ``artifact`` (:class:`Artifact`,
:class:`BuildFailed`), ``buildlog``, ``process`` (a step run, a build's leftovers),
``context`` (:class:`BuildContext`, the :class:`Builder` protocol), ``git``
(:func:`clone`), one per builder (``venv``, ``wheel``, ``docker``, ``image``, ``command``), and
``registry`` (:data:`BUILDERS`, :func:`register`, :func:`make_builder`).
"""

from crawlhub.control.builders.artifact import KINDS, Artifact, BuildFailed
from crawlhub.control.builders.buildlog import MAX_LINE, BuildLog, Redactor
from crawlhub.control.builders.context import BuildContext, Builder
from crawlhub.control.builders.git import clone, url_host
from crawlhub.control.builders.process import (
    ENV_BUILD,
    ENV_BUILD_OWNER,
    READ_TAIL,
    build_marks,
    close_pipes,
    exited,
    host_owner,
    leftover_processes,
    proc_table,
    run_process,
    scrubbed_environ,
    stop_leftovers,
)
from crawlhub.control.builders.registry import BUILDERS, check_options, make_builder, register
from crawlhub.control.builders.venv import INTEGRATIONS

__all__ = [
    "BUILDERS",
    "ENV_BUILD",
    "ENV_BUILD_OWNER",
    "INTEGRATIONS",
    "KINDS",
    "MAX_LINE",
    "READ_TAIL",
    "Artifact",
    "BuildContext",
    "BuildFailed",
    "BuildLog",
    "Builder",
    "Redactor",
    "build_marks",
    "check_options",
    "clone",
    "close_pipes",
    "exited",
    "host_owner",
    "leftover_processes",
    "make_builder",
    "proc_table",
    "register",
    "run_process",
    "scrubbed_environ",
    "stop_leftovers",
    "url_host",
]

"""Build the agent image, ``crawlhub/agent:<version>``: ``crawlhub agent`` in a container.

    python containers/agent/build.py                       # on localhost/crawlhub-base:1
    python containers/agent/build.py --base python:3.11-slim   # with a registry

Run it with the Python crawlhub is installed in. No network is needed: the image is the
base image plus what this Python already has - crawlhub's package and the distributions
its runtime needs (its dependencies and the ``redis`` extra, resolved from their
metadata), copied into the base's site directory with their bytecode, and the
shared libraries those distributions' extensions link to that the base lacks (a
``FROM scratch`` base has only Python's own). So the base must run a CPython of the same
minor version as this one (3.11 here) on a glibc at least as new as the wheels need:
``localhost/crawlhub-base:1`` (``python tests/containers/baseimage.py`` builds it) or
Debian's ``python:3.11-slim``.

It is idempotent: the image carries a fingerprint of its inputs (base image id, the
distributions and crawlhub's source) and is built again only when they change. The
entrypoint is ``python3 -m crawlhub agent``; the arguments of ``podman run`` after the
image are the agent's (docs/agents-in-containers.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import crawlhub

#: changes with the recipe, so an image of an older recipe is rebuilt
RECIPE = "3"
LABEL = "io.crawlhub.agent.fingerprint"
DEFAULT_BASE = "localhost/crawlhub-base:1"
DEFAULT_TAG = f"crawlhub/agent:{crawlhub.__version__}"
#: the modules an agent on Redis imports (their bytecode is written in the image)
WARM = ("crawlhub.cli", "crawlhub.cli.agent", "crawlhub.services", "crawlhub.agents.agent",
        "crawlhub.backends.redis", "crawlhub.sinks.jsonl", "crawlhub.sinks.redis_stream",
        "redis.asyncio", "aiohttp", "lxml.html", "parsel")


class BuildError(RuntimeError):
    """The image cannot be built; the message says why and what to do."""


def runtime_distributions(extras: tuple[str, ...] = ("redis",), python: str | None = None
                          ) -> list[metadata.Distribution]:
    """crawlhub's runtime closure: its dependencies (with ``extras``) and theirs, as the
    installed distributions, markers evaluated for the ``python`` (full version) that will
    run them (redis wants async-timeout below 3.11.3: Debian's 3.11.2 needs it, this 3.11.7
    would not)."""
    env = {} if python is None else {"python_full_version": python,
                                      "python_version": ".".join(python.split(".")[:2])}
    found: dict[str, metadata.Distribution] = {}
    todo = [(req, extras) for req in metadata.requires("crawlhub") or []]
    while todo:
        text, wanted = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not any(
                req.marker.evaluate({**env, "extra": extra}) for extra in (*wanted, "")):
            continue
        name = canonicalize_name(req.name)
        if name == "crawlhub" or name in found:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise BuildError(f"{req.name} (needed by crawlhub's {text!r}) is not installed in"
                             f" {sys.executable}: pip install 'crawlhub[redis]' there") from None
        found[name] = dist
        todo += [(sub, tuple(req.extras)) for sub in dist.requires or []]
    return sorted(found.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def _package_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def fingerprint(base_id: str, dists: list[metadata.Distribution]) -> str:
    digest = hashlib.sha256(f"{RECIPE}\n{base_id}\n".encode())
    for dist in dists:
        digest.update(f"{dist.metadata['Name']}=={dist.version}\n".encode())
    package = Path(crawlhub.__file__).resolve().parent
    for path in _package_files(package):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:32]


def _run(argv: list[str], what: str, timeout: float = 600, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=cwd)
    if done.returncode != 0:
        raise BuildError(f"{what} failed (exit {done.returncode}):"
                         f" {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


def _copy_distribution(dist: metadata.Distribution, deps: Path) -> None:
    """The distribution's files that live in site-packages (its RECORD), not scripts;
    with their bytecode (the same for every 3.11, and checked against the sources' mtime,
    which the copy keeps): the container's root is read-only, so it could not write it,
    and compiling it here takes a minute."""
    for file in dist.files or []:
        if file.parts[0] == "..":
            continue
        source = Path(str(dist.locate_file(file)))
        if source.is_file():
            target = deps / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _copy_crawlhub(deps: Path) -> None:
    package = Path(crawlhub.__file__).resolve().parent
    shutil.copytree(package, deps / "crawlhub")
    info = deps / f"crawlhub-{crawlhub.__version__}.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(metadata.distribution("crawlhub").read_text("METADATA")
                                         or f"Metadata-Version: 2.1\nName: crawlhub\n"
                                            f"Version: {crawlhub.__version__}\n")


def _linked_libraries(deps: Path) -> set[Path]:
    """The shared libraries the extensions under ``deps`` link to, outside ``deps``."""
    libs: set[Path] = set()
    for ext in deps.rglob("*.so*"):
        out = subprocess.run(["ldd", str(ext)], capture_output=True, text=True, check=False)
        for line in out.stdout.splitlines():
            match = re.search(r"=>\s+(/\S+)\s+\(0x", line)
            if match and not Path(match.group(1)).resolve().is_relative_to(deps.resolve()):
                libs.add(Path(match.group(1)))
    return libs


def _probe_base(engine: str, base: str, libs: set[Path]) -> tuple[str, str, list[Path]]:
    """The base's Python version (3.11.2) and site directory, and which of ``libs`` it
    lacks."""
    code = ("import os, platform, site, sys; print(platform.python_version());"
            " print(site.getsitepackages()[0]); [print(p) for p in sys.argv[1:]"
            " if not os.path.exists(p)]")
    out = _run([engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", base,
                "-c", code, *sorted(map(str, libs))],
               f"running python3 in the base image {base} (build it: python"
               " tests/containers/baseimage.py, or give --base)", timeout=120).splitlines()
    if len(out) < 2:
        raise BuildError(f"the base image {base} did not say its Python: {out}")
    return out[0], out[1], [Path(p) for p in out[2:]]


def build(base: str = DEFAULT_BASE, tag: str = DEFAULT_TAG, engine: str = "podman",
          extras: tuple[str, ...] = ("redis",),
          say: Callable[[str], object] = print) -> str:
    """Build ``tag`` unless an image of the same inputs has it; what was done."""
    host = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if shutil.which(engine) is None:
        raise BuildError(f"{engine} is not installed: apt-get install -y podman runc")
    base_id = _run([engine, "image", "inspect", "--format", "{{.Id}}", base],
                   f"{engine} image inspect {base} (build it: python"
                   " tests/containers/baseimage.py, or pull it)").strip()
    python, _, _ = _probe_base(engine, base, set())
    if python.rpartition(".")[0] != host:
        raise BuildError(f"the base image {base} runs Python {python}, this one {host}: the"
                         f" copied extensions need the same; use a python:{host} base or"
                         f" run this script with a Python {python.rpartition('.')[0]}")
    dists = runtime_distributions(extras, python)
    want = fingerprint(base_id, dists)  # the base's id covers its Python
    have = subprocess.run([engine, "image", "inspect", "--format",
                           f"{{{{index .Labels \"{LABEL}\"}}}}", tag],
                          capture_output=True, text=True, check=False)
    if have.returncode == 0 and have.stdout.strip() == want:
        return f"{tag} is up to date (fingerprint {want})"
    with tempfile.TemporaryDirectory(prefix="crawlhub-agent-image-") as tmp:
        context = Path(tmp)
        deps = context / "deps"
        deps.mkdir()
        for dist in dists:
            _copy_distribution(dist, deps)
        _copy_crawlhub(deps)
        _, site, missing = _probe_base(engine, base, _linked_libraries(deps))
        lines = [f"FROM {base}"]
        if missing:
            libs = context / "libs"
            for lib in missing:
                target = libs / lib.relative_to("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(lib.resolve(), target)  # the library itself, at the linked name
            lines.append("COPY libs/ /")
        lines += [f"COPY deps/ {site}/",
                  f"LABEL {LABEL}={want} org.opencontainers.image.title=crawlhub-agent"
                  f" org.opencontainers.image.version={crawlhub.__version__}",
                  "WORKDIR /tmp",
                  # the bytecode of what an agent imports, written now: at run time the
                  # root is read-only and every start would compile it again
                  "RUN " + json.dumps(["python3", "-c", "import importlib\nfor m in"
                                       f" {list(WARM)!r}: importlib.import_module(m)"]),
                  "ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1",
                  'ENTRYPOINT ["python3", "-m", "crawlhub", "agent"]']
        (context / "Containerfile").write_text("\n".join(lines) + "\n")
        say(f"building {tag} on {base} (Python {python}): {len(dists)} distributions + crawlhub"
               f" {crawlhub.__version__}, {len(missing)} shared libraries the base lacks")
        _run([engine, "build", "-q", "-t", tag, "-f", "Containerfile", "."], f"{engine} build",
             cwd=context)
    size = _run([engine, "image", "inspect", "--format", "{{.Size}}", tag], "inspect").strip()
    return f"{tag} built ({int(size) / 1e6:.0f} MB, fingerprint {want})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"base image (default {DEFAULT_BASE})")
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image tag (default {DEFAULT_TAG})")
    parser.add_argument("--engine", default="podman", help="podman (default) or docker")
    parser.add_argument("--json", action="store_true", help="print {tag, done} as JSON")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        done = build(args.base, args.tag, args.engine, say=lambda s: print(s, file=sys.stderr))
    except BuildError as exc:
        print(f"agent image: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"tag": args.tag, "done": done}))
    else:
        print(f"{done} in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

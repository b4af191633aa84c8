"""The base image of the ``image`` builder's default recipe and of the container tests:
``FROM scratch`` holding the host's Debian ``/usr/bin/python3.11``, its standard library
and the shared libraries ``ldd`` lists for them. Nothing is pulled (no registry needs to
answer); about 75 MB, a few seconds to build.

    crawlhub builds base-image            # builds it unless the engine has it

:func:`ensure_base_image` is idempotent: it skips the build when ``<engine> image
exists`` says the tag is there. The one place of this recipe.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

#: The tag; the number changes with the recipe, so an old image is never taken for it.
BASE_IMAGE = "localhost/crawlhub-base:1"
PYTHON = Path("/usr/bin/python3.11")
STDLIB = Path("/usr/lib/python3.11")
ENGINE = "podman"


class NoEngine(RuntimeError):
    """No container engine can build or run here; the message says why and the fix."""


def engine_problem(engine: str = ENGINE) -> str | None:
    """Why containers cannot run here (None: they can)."""
    if shutil.which(engine) is None:
        return (f"{engine} is not installed: apt-get install -y podman runc (and"
                " /etc/containers/containers.conf as .ci/run writes it)")
    probe = subprocess.run([engine, "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                           capture_output=True, text=True, timeout=60, check=False)
    if probe.returncode != 0:
        return f"{engine} info failed: {probe.stderr.strip()[-400:]}"
    return None


def _libraries(binary: Path) -> set[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    found = set()
    for line in out.stdout.splitlines():
        match = re.search(r"(/\S+)\s+\(0x", line)
        if match:
            found.add(Path(match.group(1)))
    return found


def _copy(path: Path, root: Path) -> None:
    target = root / path.relative_to("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path.resolve(), target)  # -L: the library itself, at the linked name


def ensure_base_image(tag: str = BASE_IMAGE, engine: str = ENGINE) -> str:
    """Build ``tag`` unless the engine has it; the tag. :class:`NoEngine` saying why
    when no engine can build it."""
    why = engine_problem(engine)
    if why:
        raise NoEngine(why)
    if subprocess.run([engine, "image", "exists", tag], check=False).returncode == 0:
        return tag
    if not PYTHON.exists() or not STDLIB.is_dir():
        raise NoEngine(f"{PYTHON} and {STDLIB} are needed for the base image: apt-get"
                       " install -y python3.11")
    with tempfile.TemporaryDirectory(prefix="crawlhub-base-") as tmp:
        root = Path(tmp) / "root"
        shutil.copytree(STDLIB, root / STDLIB.relative_to("/"), symlinks=False,
                        ignore=shutil.ignore_patterns("__pycache__", "test", "idlelib",
                                                      "tkinter", "turtledemo"))
        _copy(PYTHON, root)
        libs = _libraries(PYTHON)
        for module in (STDLIB / "lib-dynload").glob("*.so"):
            libs |= _libraries(module)
        for lib in libs:
            _copy(lib, root)
        (root / "usr/bin/python3").symlink_to("python3.11")
        (root / "tmp").mkdir(exist_ok=True)
        (root / "tmp").chmod(0o1777)  # mkdir's mode goes through the umask
        (Path(tmp) / "Containerfile").write_text(
            "FROM scratch\nCOPY root/ /\nCMD [\"/usr/bin/python3\"]\n")
        done = subprocess.run([engine, "build", "-q", "-t", tag, "-f", "Containerfile", "."],
                              cwd=tmp, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise NoEngine(f"{engine} build of {tag} failed: {done.stderr.strip()[-800:]}")
    return tag

"""Scrapy eggs as Scrapyd takes them (``scrapyd-deploy`` builds one with ``bdist_egg``):
read, laid out as a build's artifact, and asked for their spiders (``scrapy list``).

An egg holds the project's code only, never its dependencies: as under Scrapyd, it runs
on the server's own Python and packages (Scrapy among them), with the egg first on
``PYTHONPATH`` and ``SCRAPY_SETTINGS_MODULE`` read from its ``scrapy`` entry point.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import os
import re
import shutil
import signal
import sys
import zipfile
from io import BytesIO
from pathlib import Path

from crawlhub.control.builders import Artifact
from crawlhub.core.errors import CrawlhubError

#: The egg's file name inside its build's directory.
EGG_FILE = "project.egg"
#: Bytes of ``scrapy list`` output read at most (a spider a line).
MAX_LIST_OUTPUT = 1024 * 1024
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_WRAPPER = """#!{python}
# crawlhub: Scrapy as the server has it - an uploaded egg runs on the server's Python and
# packages, as under Scrapyd (docs/scrapyd.md)
import sys
from scrapy.cmdline import execute
sys.exit(execute())
"""


class ScrapydError(CrawlhubError):
    """What Scrapyd answers ``{"status": "error", "message": ...}`` with: the message
    names the input and what to do."""


def settings_module(egg: bytes) -> str:
    """The settings module the egg's ``scrapy`` entry point names (its
    ``EGG-INFO/entry_points.txt``: ``[scrapy] settings = shop.settings``, which
    ``scrapyd-deploy`` writes); :class:`ScrapydError` for anything else."""
    if not zipfile.is_zipfile(BytesIO(egg)):
        # Scrapyd's own words (curl users send the path instead of the file)
        raise ScrapydError("egg is not a ZIP file (if using curl, use egg=@path not"
                           " egg=path)")
    try:
        with zipfile.ZipFile(BytesIO(egg)) as archive:
            text = archive.read("EGG-INFO/entry_points.txt").decode("utf-8", "replace")
    except KeyError:
        raise ScrapydError("egg has no EGG-INFO/entry_points.txt: build it with"
                           " scrapyd-deploy (its setup.py names the settings module in"
                           " entry_points={'scrapy': ['settings = myproject.settings']})"
                           ) from None
    except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError) as exc:
        raise ScrapydError(f"egg cannot be read as a ZIP file: {exc}") from None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text[:100_000])
    except configparser.Error:
        raise ScrapydError("egg's EGG-INFO/entry_points.txt is not an INI file") from None
    module = parser.get("scrapy", "settings", fallback="").strip()
    if not module:
        raise ScrapydError("egg has no 'scrapy' entry point 'settings' in"
                           " EGG-INFO/entry_points.txt: build it with scrapyd-deploy (its"
                           " setup.py says entry_points={'scrapy': ['settings ="
                           " myproject.settings']})")
    module = module.partition(":")[0].strip()
    if not _MODULE_RE.match(module) or len(module) > 200:
        raise ScrapydError(f"egg's settings entry point {module[:80]!r} is not a module"
                           " name such as 'myproject.settings'")
    return module


def lay_out(root: Path, egg: bytes, *, project: str, version: str, settings: str) -> Artifact:
    """Write the egg into ``root`` (a fresh build directory) with a ``bin/scrapy`` of the
    server's Python; the artifact a job runs (``kind`` ``egg``, run in ``root``)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / EGG_FILE
    path.write_bytes(egg)
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scrapy"
    script.write_text(_WRAPPER.format(python=sys.executable))
    script.chmod(0o755)
    return Artifact(project=project, version=version, kind="egg", path=str(path),
                    workdir=str(root), bin_dir=str(bin_dir),
                    env={"CRAWLHUB_PROJECT": project, "CRAWLHUB_VERSION": version,
                         "PYTHONPATH": str(path), "SCRAPY_SETTINGS_MODULE": settings,
                         # Scrapyd's variables: its runner and spiders may read them
                         "SCRAPY_PROJECT": project, "SCRAPYD_EGG_VERSION": version})


async def list_spiders(artifact: Artifact, *, timeout: float) -> list[str]:
    """The spiders of a build: ``scrapy list`` in its directory and environment (an egg's
    or a virtualenv's), as Scrapyd runs it; :class:`ScrapydError` with the end of its
    output when it fails."""
    if artifact.workdir is None:
        raise ScrapydError(f"build {artifact.build} of {artifact.project} {artifact.version}"
                           f" is a {artifact.kind} ({artifact.path}): its spiders cannot be"
                           " listed here; use the venv builder or upload an egg")
    env = artifact.environ()
    env["PYTHONIOENCODING"] = "UTF-8"
    program = shutil.which("scrapy", path=env.get("PATH"))
    if program is None:
        raise ScrapydError(f"build {artifact.build} of {artifact.project} {artifact.version}"
                           " has no 'scrapy' command: install Scrapy in the project (its"
                           " requirements) or on the server (pip install 'crawlhub[scrapy]')")
    proc = await asyncio.create_subprocess_exec(
        program, "list", "-s", "LOG_STDOUT=0", cwd=artifact.workdir, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        raise ScrapydError(f"'scrapy list' of {artifact.project} {artifact.version} ran"
                           f" over {timeout:.0f} s (scrapyd.list_timeout)") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    if proc.returncode:
        tail = (err or out or b"")[-4000:].decode("utf-8", "replace").strip()
        raise ScrapydError(f"'scrapy list' of {artifact.project} {artifact.version} failed"
                           f" (exit {proc.returncode}): {tail}")
    return [line.strip() for line in out[:MAX_LIST_OUTPUT].decode("utf-8", "replace")
            .splitlines() if line.strip()]

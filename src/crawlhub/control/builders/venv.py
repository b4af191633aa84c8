"""The ``venv`` builder (the default): a virtualenv of the tag, the project or its
requirements installed by this process's own pip, crawlhub and its integrations linked
in from the server's environment (``sdk``)."""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import re
import sys
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from crawlhub.control.builders.artifact import Artifact, BuildFailed
from crawlhub.control.builders.context import BuildContext, BuilderOptions, packaged
from crawlhub.core.configtypes import new_list


def _pip_can_target() -> bool:
    """Whether this interpreter's pip can install into another environment
    (``pip --python``, pip >= 22.3)."""
    try:
        from pip import __version__ as version
    except ImportError:
        return False
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]] + [0, 0]
    return (parts[0], parts[1]) >= (22, 3)


def _pip(venv_python: Path, host: bool) -> list[str]:
    head = ([sys.executable, "-m", "pip", "--python", str(venv_python)] if host
            else [str(venv_python), "-m", "pip"])
    return [*head, "--disable-pip-version-check", "--no-input"]


class VenvBuilder:
    """A virtualenv of the tag: the project (``pip install .``) or its requirements
    installed, or nothing for plain scripts."""

    name: ClassVar[str] = "venv"

    class Options(BuilderOptions):
        python: str | None = Field(None, description="the interpreter the venv is made"
                                   " from (default: crawlhub's own)")
        system_site_packages: bool = Field(False, description="let the venv see the"
                                           " interpreter's installed packages")
        install: Literal["auto", "project", "requirements", "none"] = Field(
            "auto", description="auto: the project when it has pyproject.toml or"
            " setup.py, else requirements.txt when present, else nothing")
        pip_args: list[str] = Field(default_factory=new_list, max_length=50,
                                    description="extra arguments of pip install")
        sdk: bool = Field(True, description="make crawlhub importable in the venv, with"
                          " its dependencies and Scrapy as the server has them (a .pth"
                          " naming a directory of links to them, after the venv's own"
                          " packages)")

    def __init__(self, options: Options) -> None:
        self.options = options

    async def build(self, ctx: BuildContext) -> Artifact:
        venv = await self._venv(ctx)
        return ctx.artifact("venv", venv, workdir=ctx.src, bin_dir=venv / "bin",
                            env={"VIRTUAL_ENV": str(venv)})

    async def _venv(self, ctx: BuildContext) -> Path:
        opts = self.options
        install = opts.install
        if install == "auto":
            install = ("project" if packaged(ctx.src) else "requirements"
                       if (ctx.src / "requirements.txt").is_file() else "none")
        if install == "project" and not packaged(ctx.src):
            raise BuildFailed("install: project, but the tag has no pyproject.toml or"
                              " setup.py")
        if install == "requirements" and not (ctx.src / "requirements.txt").is_file():
            raise BuildFailed("install: requirements, but the tag has no requirements.txt")
        venv = ctx.root / "venv"
        host_pip = _pip_can_target()
        argv = [opts.python or sys.executable, "-m", "venv"]
        if install == "none" or host_pip:
            argv.append("--without-pip")
        if opts.system_site_packages:
            argv.append("--system-site-packages")
        await ctx.run([*argv, str(venv)], what="python -m venv")
        python = venv / "bin" / "python"
        if opts.sdk:  # before the install: what it provides needs no download
            await asyncio.to_thread(sdk_closure)  # read once per process, off the loop
            _link_sdk(ctx, venv)
        if install == "project":
            await ctx.run([*_pip(python, host_pip), "install", *opts.pip_args, "."],
                          what="pip install .")
        elif install == "requirements":
            await ctx.run([*_pip(python, host_pip), "install", *opts.pip_args, "-r",
                           "requirements.txt"], what="pip install -r requirements.txt")
        return venv


#: Packages crawlhub integrates with (``crawlhub.contrib``): a venv gets them, and their
#: commands, from the server when the server has them, as it gets crawlhub's own
#: dependencies - a Scrapy project's job imports what ``CrawlhubControl`` needs.
INTEGRATIONS = ("scrapy",)
#: crawlhub's extras a venv does not get (tools for its own tests).
_DEV_EXTRAS = frozenset({"dev"})
_REQ_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_RE = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_SCRIPT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_OBJECT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def sdk_closure() -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """What a venv's ``sdk/`` links, read once from this interpreter's installed
    distributions: ((top-level name, its path), ...) of crawlhub's requirements (of its
    extras too, but dev), of :data:`INTEGRATIONS`, and of everything they require,
    recursively, as far as installed; and ((command, "module:object"), ...), the
    console scripts of the integrations. crawlhub's own package is linked apart."""
    links: dict[str, str] = {}
    scripts: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str], bool]] = [("crawlhub", frozenset(), True)]
    todo += [(name, frozenset(), False) for name in INTEGRATIONS]
    while todo:
        name, extras, own = todo.pop()
        if (_canonical(name), extras) in seen:
            continue
        seen.add((_canonical(name), extras))
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: the project installs it, or goes without
        for line in dist.requires or ():
            req, _, marker = line.partition(";")
            m = _REQ_RE.match(req)
            if m is None:
                continue
            wanted = _EXTRA_RE.search(marker)
            if wanted and not (wanted.group(1) in extras
                               or (own and wanted.group(1) not in _DEV_EXTRAS)):
                continue
            more = frozenset(e.strip() for e in (m.group(2) or "").split(",") if e.strip())
            todo.append((m.group(1), more, False))
        for file in dist.files or ():
            top = Path(str(file)).parts[0] if str(file) else ""
            if (not top or top in ("..", "__pycache__") or top.endswith(".pth")
                    or top.startswith("__editable__") or (own and top == "crawlhub")):
                continue
            links.setdefault(top, str(dist.locate_file(top)))
        if _canonical(name) in INTEGRATIONS:
            for ep in dist.entry_points.select(group="console_scripts"):
                if _SCRIPT_RE.match(ep.name) and _OBJECT_RE.match(ep.value):
                    scripts.setdefault(ep.name, ep.value)
    return tuple(sorted(links.items())), tuple(sorted(scripts.items()))


_WRAPPER = """#!{python}
# crawlhub: {name} as the server has it (linked in {sdk}); an install of the project's own
# replaces this file
import sys
from {module} import {head}
sys.exit({call}())
"""


def _link_sdk(ctx: BuildContext, venv: Path) -> None:
    """Let the venv import crawlhub, its dependencies and :data:`INTEGRATIONS` as this
    interpreter has them, and nothing else of it: ``root/sdk`` holds links to them (and
    to their ``.dist-info``, so pip counts them installed and downloads none of them), a
    .pth in the venv names it after site-packages (what the project installs itself
    wins), and ``venv/bin`` gets the integrations' commands (``scrapy``). Compiled
    packages only fit the same Python: a venv of another version gets crawlhub alone."""
    import crawlhub

    where = ctx.root / "sdk"
    where.mkdir(parents=True, exist_ok=True)
    link = where / "crawlhub"
    if not link.exists():
        link.symlink_to(Path(crawlhub.__file__).resolve().parent, target_is_directory=True)
    sites = list(venv.glob("lib/python*/site-packages"))
    same = [site for site in sites
            if site.parent.name == f"python{sys.version_info[0]}.{sys.version_info[1]}"]
    if sites and not same:
        ctx.say(f"sdk: the venv's Python is not crawlhub's ({sys.version.split()[0]}):"
                " only crawlhub is linked; the project installs what it needs")
    else:
        links, scripts = sdk_closure()
        for top, target in links:
            entry = where / top
            if not entry.exists() and not entry.is_symlink():
                entry.symlink_to(target, target_is_directory=Path(target).is_dir())
        python = venv / "bin" / "python"
        for name, value in scripts:
            script = venv / "bin" / name
            if script.exists():
                continue
            module, _, obj = value.partition(":")
            script.write_text(_WRAPPER.format(python=python, name=name, sdk=where,
                                              module=module, head=obj.split(".")[0],
                                              call=obj))
            script.chmod(0o755)
        ctx.say(f"sdk: crawlhub and what it needs ({len(links)} entries) linked from the"
                " server's environment into sdk/; the venv's own packages come first")
    for site in sites:
        (site / "crawlhub-sdk.pth").write_text(f"{where}\n")

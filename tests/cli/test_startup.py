"""Start-up stays cheap: a command imports what it uses and no more. Checked by the
modules a fresh interpreter holds after the command, never by timing (bench/startup.py
times it)."""

from __future__ import annotations

import json
import subprocess
import sys

#: What no help listing, and no crawl, may import: the web stack, the browser, the
#: crypto of the control plane, the config models.
HEAVY = ("fastapi", "starlette", "uvicorn", "jinja2", "cryptography", "playwright")

_PROBE = """
import json, sys
sys.argv = {argv!r}
from crawlhub.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def loaded_after(*argv: str) -> set[str]:
    """The modules imported by ``crawlhub <argv>`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _PROBE.format(argv=["crawlhub", *argv])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_importing_the_cli_imports_no_command_no_config_and_no_web_stack() -> None:
    done = subprocess.run([sys.executable, "-c", "import json, sys, crawlhub.cli;"
                           " print(json.dumps(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout))
    assert heavy(modules) == []
    assert sorted(m for m in modules if m.startswith("crawlhub.")) == [
        "crawlhub.cli", "crawlhub.core", "crawlhub.core.errors", "crawlhub.core.jsoncodec"]
    assert not {"pydantic", "yaml", "aiohttp", "redis"} & modules


def test_help_lists_every_command_without_importing_any() -> None:
    modules = loaded_after("--help")
    assert heavy(modules) == []
    assert not [m for m in modules if m.startswith(("crawlhub.cli.", "crawlhub.config"))]


def test_crawl_help_imports_only_the_crawl_command() -> None:
    modules = loaded_after("crawl", "--help")
    assert heavy(modules) == []
    assert [m for m in modules if m.startswith("crawlhub.cli.")] == ["crawlhub.cli.crawl"]
    assert not {"crawlhub.config", "crawlhub.app.crawl", "aiohttp", "yaml"} & modules

"""The CLI documents itself: every option (and argument) has help text, and the command
summaries of ``crawlhub --help`` are whole sentences, not cut off with "..."."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from typer.testing import CliRunner

from crawlhub.cli import _LAZY, app, load_all_commands


def commands(cmd: Any, path: tuple[str, ...] = ("crawlhub",)) -> Iterator[tuple[str, Any]]:
    """Every command and group under ``cmd`` with its full name."""
    yield " ".join(path), cmd
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        yield from commands(sub, (*path, name))


def test_every_option_and_argument_has_help_text() -> None:
    missing = [
        f"{name} {'/'.join(param.opts)}"
        for name, cmd in commands(load_all_commands())
        for param in cmd.params
        if param.name != "help" and not (getattr(param, "help", None) or "").strip()
    ]
    assert missing == []


def test_command_summaries_in_help_are_not_cut_off() -> None:
    root = load_all_commands()
    groups = [(name, cmd) for name, cmd in commands(root) if getattr(cmd, "commands", None)]
    names = {name for name, _ in groups}
    assert {"crawlhub", "crawlhub jobs", "crawlhub runs", "crawlhub logs",
            "crawlhub projects", "crawlhub builds", "crawlhub alerts"} <= names
    for name, group in groups:
        listing = CliRunner().invoke(app, [*name.split()[1:], "--help"]).stdout
        section = listing.split("Commands:", 1)[1]
        for sub_name, sub in group.commands.items():
            first = (sub.help or "").strip().splitlines()[0]
            line = next(li for li in section.splitlines() if li.split()[:1] == [sub_name])
            assert line.split(None, 1)[1].strip() == first, (name, sub_name)
            assert not line.rstrip().endswith("..."), line


_WITHOUT_EXTRAS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"redis", "asyncpg", "aiokafka", "curl_cffi", "scrapy",
                                  "playwright"}:
            raise ImportError("not installed: " + name)
sys.meta_path.insert(0, Block())
sys.argv = ["crawlhub", "--help"]
from crawlhub.cli import main
main()
"""


def test_every_sub_command_is_in_help_without_the_optional_extras() -> None:
    done = subprocess.run([sys.executable, "-c", _WITHOUT_EXTRAS], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.split("Commands:", 1)[1].splitlines()
              if line.strip()}
    assert {"frontier", "collect", "demo", "agents", "crawl", "agent", "center", "jobs",
            "runs", "logs", "projects", "builds", "alerts"} <= listed


def test_the_summaries_listed_without_importing_are_the_commands_own() -> None:
    root = load_all_commands()
    for name, _, summary in _LAZY:
        assert summary == (root.commands[name].help or "").strip().splitlines()[0], name


def test_a_sub_command_that_fails_to_import_fails_loudly_and_stays_listed() -> None:
    broken = ("import sys; sys.modules['crawlhub.cli.demo'] = None; sys.argv = {argv!r};"
              " from crawlhub.cli import main; main()")
    done = subprocess.run([sys.executable, "-c", broken.format(argv=["crawlhub", "demo"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "crawlhub.cli.demo" in done.stderr.strip().splitlines()[-1]  # the import error
    listing = subprocess.run([sys.executable, "-c", broken.format(argv=["crawlhub", "--help"])],
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert "demo " in listing.stdout.split("Commands:", 1)[1]

"""Lazy package faces (crawlhub.core.lazy): every public name of a package resolves to the
object its module defines, on first use; other names stay AttributeErrors, so
``from pkg import submodule`` still imports the submodule."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

LAZY = ("agents", "center", "collect", "fetch", "frontier", "pipeline", "sinks")


@pytest.mark.parametrize("name", LAZY)
def test_every_public_name_resolves_to_the_object_of_its_module(name: str) -> None:
    package = importlib.import_module(f"crawlhub.{name}")
    for public in package.__all__:
        assert public in dir(package)
        value = getattr(package, public)
        assert package.__dict__[public] is value  # kept: the next access is a dict hit
        if getattr(value, "__module__", "").startswith("crawlhub."):  # (not type aliases)
            home = importlib.import_module(value.__module__)
            assert getattr(home, public) is value, public  # the module's own object
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        package.not_a_name  # noqa: B018 - the access is the test


def test_a_package_imports_its_modules_when_a_name_is_first_used() -> None:
    probe = ("import sys, crawlhub.agents as a\n"
             "before = 'crawlhub.agents.downloader' in sys.modules\n"
             "a.Downloader\n"
             "print(before, 'crawlhub.agents.downloader' in sys.modules,"
             " a.__dict__.get('Downloader') is not None)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]

"""Every Lua script crawlhub sends lives in a ``lua/`` folder beside its module and loads
through :func:`crawlhub.backends.redis.lua`; each one compiles on a real server."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

import pytest
import redis.asyncio as aioredis

from crawlhub.backends.redis import lua


def lua_files() -> list[tuple[str, str]]:
    """(package, file name) of every ``lua/*.lua`` inside crawlhub."""
    found: list[tuple[str, str]] = []

    def walk(folder: Traversable, package: str) -> None:
        for entry in folder.iterdir():
            if not entry.is_dir() or entry.name.startswith(("_", ".")):
                continue
            if entry.name == "lua":
                found.extend((package, f.name) for f in entry.iterdir() if f.name.endswith(".lua"))
            elif entry.joinpath("__init__.py").is_file():
                walk(entry, f"{package}.{entry.name}")

    walk(resources.files("crawlhub"), "crawlhub")
    return sorted(found)


FILES = lua_files()


def test_the_scripts_are_found() -> None:
    packages = {package for package, _ in FILES}
    assert {"crawlhub.queues", "crawlhub.frontier", "crawlhub.hub.state",
            "crawlhub.hub.state.intake", "crawlhub.agents.registry",
            "crawlhub.agents.politeness", "crawlhub.center", "crawlhub.sinks"} <= packages
    assert len(FILES) >= 40


@pytest.mark.parametrize(("package", "name"), FILES, ids=[f"{p}/{n}" for p, n in FILES])
async def test_every_script_loads_and_compiles(redis_url: str, package: str, name: str) -> None:
    text = lua(package, name)
    assert text == resources.files(package).joinpath("lua", name).read_text(encoding="utf-8")
    assert text.strip()
    client = aioredis.Redis.from_url(redis_url)
    try:  # SCRIPT LOAD compiles without running; a placeholder filled in Python is a number
        await client.script_load(text.replace("@DEFAULT_MAX_ATTEMPTS@", "0"))
    finally:
        await client.aclose()


def test_lua_joins_scripts_in_order_and_refuses_no_package() -> None:
    assert lua("crawlhub.queues", "push_rows.lua", "push.lua") == (
        lua("crawlhub.queues", "push_rows.lua") + lua("crawlhub.queues", "push.lua"))
    with pytest.raises(ValueError, match="__package__"):
        lua(None, "push.lua")
    with pytest.raises(FileNotFoundError):
        lua("crawlhub.queues", "no_such_script.lua")

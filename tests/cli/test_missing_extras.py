"""A missing optional extra is one line naming ``pip install 'crawlhub[extra]'``, never a
traceback. Each test runs ``crawlhub`` in a subprocess whose imports of the extra's client
are blocked (``sys.modules[name] = None`` makes ``import name`` fail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crawlhub.core.errors import MissingExtraError
from crawlhub.core.extras import require
from tests.servers import free_port

from .conftest import write_yaml


def crawlhub_without(blocked: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``crawlhub ARGS`` with the package ``blocked`` made unimportable."""
    code = (f"import sys; sys.modules[{blocked!r}] = None; sys.argv[0] = 'crawlhub'; "
            "from crawlhub.cli import main; main()")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_require_names_the_extra_to_install() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require("crawlhub_no_such_client.sub", "redis", needed_by="sink 'events'")
    assert str(caught.value) == ("sink 'events' needs the Python package "
                                 "'crawlhub_no_such_client', which is not installed: "
                                 "pip install 'crawlhub[redis]'")
    assert (caught.value.module, caught.value.extra) == ("crawlhub_no_such_client.sub", "redis")


def test_require_returns_the_module_when_it_is_installed() -> None:
    assert require("json", "none").dumps([1]) == "[1]"


def test_queues_on_redis_without_the_redis_extra_is_one_line(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "redis.yaml", {
        "data_dir": str(tmp_path / "data"), "storage": {"queues": "redis://127.0.0.1:6379/0"}})
    done = crawlhub_without("redis", "queues", "-c", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error the Redis queue backend (storage.queues) needs the Python package 'redis', "
        "which is not installed: pip install 'crawlhub[redis]'"]


def test_serve_on_redis_without_the_redis_extra_ends_with_one_line(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "redis.yaml", {
        "data_dir": str(tmp_path / "data"),
        "storage": {"queues": "redis://127.0.0.1:6379/0", "state": "redis://127.0.0.1:6379/0"}})
    done = crawlhub_without("redis", "serve", "-c", str(config), "--port", str(free_port()),
                            cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("error ")
    assert done.stderr.splitlines()[-1].endswith(
        "needs the Python package 'redis', which is not installed: pip install 'crawlhub[redis]'")


def test_a_frontier_on_redis_without_the_redis_extra_is_one_line(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "frontier.yaml", {
        "data_dir": str(tmp_path / "data"), "frontier": {"news": {}},
        "storage": {"frontier": "redis://127.0.0.1:6379/0"}})
    done = crawlhub_without("redis", "frontier", "stats", "-c", str(config), cwd=tmp_path)
    assert done.returncode != 0
    assert done.stderr.splitlines() == [
        "error the Redis frontier store (storage.frontier) needs the Python package 'redis', "
        "which is not installed: pip install 'crawlhub[redis]'"]


def test_a_postgres_sink_without_asyncpg_fails_the_run_naming_the_extra(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "pg.yaml", {
        "data_dir": str(tmp_path / "data"),
        "jobs": [{"name": "news", "source": {"url": "http://127.0.0.1:9/api"},
                  "sink": {"type": "postgres", "url": "postgresql://postgres@127.0.0.1/x",
                           "table": "news", "key": "id"}}]})
    done = crawlhub_without("asyncpg", "collect", "news", "-c", str(config), "--no-progress",
                            cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    summary = done.stdout.splitlines()[0]
    assert summary.startswith("news: FAILED")
    assert summary.endswith("sink 'news' needs the Python package 'asyncpg', which is not "
                            "installed: pip install 'crawlhub[postgres]')")


def test_the_curl_client_without_curl_cffi_names_the_curl_extra() -> None:
    code = ("import sys; sys.modules['curl_cffi'] = None\n"
            "from crawlhub.core.errors import MissingExtraError\n"
            "from crawlhub.fetch.http import make_client\n"
            "try:\n    make_client('curl_cffi')\n"
            "except MissingExtraError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == ("the curl_cffi HTTP client needs the Python package "
                                   "'curl_cffi', which is not installed: "
                                   "pip install 'crawlhub[curl]'")


def test_the_kafka_sink_without_aiokafka_names_the_kafka_extra() -> None:
    code = ("import sys; sys.modules['aiokafka'] = None\n"
            "from crawlhub.core.errors import MissingExtraError\n"
            "from crawlhub.sinks.kafka import load_aiokafka\n"
            "try:\n    load_aiokafka(\"sink 'events'\")\n"
            "except MissingExtraError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == ("sink 'events' needs the Python package 'aiokafka', which "
                                   "is not installed: pip install 'crawlhub[kafka]'")


@pytest.mark.parametrize("command", [
    ["crawl", "http://127.0.0.1:9/", "--center", "redis://127.0.0.1:6379/0", "--quiet"],
    ["center", "--center", "redis://127.0.0.1:6379/0"],
    ["agent", "--center", "redis://127.0.0.1:6379/0"],
], ids=["crawl", "center", "agent"])
def test_the_extra_keeps_its_brackets_in_crawl_center_and_agent(
        tmp_path: Path, command: list[str]) -> None:
    # (Rich markup took "[redis]" for a tag: the hint read pip install 'crawlhub')
    done = crawlhub_without("redis", *command, cwd=tmp_path)
    assert done.returncode != 0
    assert done.stderr.splitlines() == [
        "error download center bus needs the Python package 'redis', which is not"
        " installed: pip install 'crawlhub[redis]'"]


def test_check_config_names_a_configured_backend_whose_package_is_missing(
        tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "redis.yaml", {
        "data_dir": str(tmp_path / "data"), "storage": {"state": "redis://127.0.0.1:6379/0"}})
    done = crawlhub_without("redis", "check-config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error the Redis backend of storage.state needs the Python package 'redis', which is"
        " not installed: pip install 'crawlhub[redis]'"]
